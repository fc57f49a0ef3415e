"""The sharded update of ``DistributedTrainer(sharded_update=True)``.

Each gradient is reduce-scattered in place, so that every rank holds the
sum of one share of it (``shard_range``); each rank runs the optimizer on its
share of every parameter only, with optimizer state for that share; then
every weight is allgathered in place. The reduce-scatter and the allgather
move the bytes of one allreduce, and the update costs 1/N of the full one:
the division of work of MXNet's parameter server (``kvstore dist_sync``
updates on its servers), without servers. All of it is pushed onto MXNet's
engine, so the next forward pass waits for the allgathers on its own.

Parameters of fewer than SHARD_MIN_ELEMENTS elements are allreduced
together and updated whole, on every rank.

Only optimizers whose update of an element reads that element alone (of the
weight, the gradient and the state) give the same result on shares: SGD and
Adam do, LAMB and LARS (norms over whole parameters) do not and are refused.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from kolo.common.basics import Sum

from .compression import Compression
from .ops import shard_allgather_, shard_range, shard_reducescatter_

# Class names (lower case) of MXNet 1.9's element-wise optimizers.
ELEMENTWISE = frozenset({"sgd", "nag", "signum", "adam", "adamax", "nadam", "rmsprop",
                         "adagrad", "adadelta", "ftrl", "ftml", "dcasgd"})


def check_optimizer(optimizer: Any) -> None:
    name = type(optimizer).__name__.lower()
    if name not in ELEMENTWISE:
        raise ValueError(
            f"kolo: DistributedTrainer(sharded_update=True) needs an element-wise optimizer "
            f"({', '.join(sorted(ELEMENTWISE))}); {type(optimizer).__name__} reads more than "
            f"one element of a parameter per update (LAMB and LARS use whole-parameter norms)")


# Parameters of fewer elements are allreduced together (one grouped
# operation per dtype) and updated whole: a reduce-scatter and an allgather of
# their own would cost more than the 1/N of their update they save.
SHARD_MIN_ELEMENTS = 1 << 16


def _sharded(param: Any) -> bool:
    return param.list_data()[0].size >= SHARD_MIN_ELEMENTS


def _views(param: Any, lo: int, hi: int) -> Tuple[Any, Any]:
    """This rank's share of the parameter's weight and gradient: views that
    write into the arrays themselves."""
    return (param.list_grad()[0].reshape(-1)[lo:hi], param.list_data()[0].reshape(-1)[lo:hi])


def reducescatter_grads(trainer: Any) -> None:
    """The large gradients reduce-scattered, the small ones allreduced whole
    (``trainer._reduce``, in one group per dtype)."""
    pre = 1.0 / trainer._gradient_predivide_factor
    small: Dict[Any, List[Any]] = {}
    for i, p in enumerate(trainer._params):
        if p.grad_req == "null":
            continue
        grad = p.list_grad()[0]
        if not _sharded(p):
            small.setdefault(grad.dtype, []).append(grad)
            continue
        sent, ctx = trainer._compression.compress(grad)
        shard_reducescatter_(sent, name=f"{trainer._prefix}{i}", priority=-i, op=Sum,
                             prescale_factor=pre, process_set=trainer._process_set)
        if trainer._compression is not Compression.none:
            grad[:] = trainer._compression.decompress(sent, ctx)
    for k, (dtype, grads) in enumerate(small.items()):
        trainer._reduce(grads, f"{trainer._prefix}whole.{k}", 0, pre)


def update(trainer: Any, ignore_stale_grad: bool) -> None:
    """gluon.Trainer._update on this rank's shares, then the allgathers. A
    parameter skipped as stale is still allgathered, so that every rank makes
    the same calls."""
    if getattr(trainer, "_amp_loss_scaler", None) is not None:
        raise ValueError("kolo: DistributedTrainer(sharded_update=True) does not take AMP's "
                         "loss scaler (its overflow check reads whole gradients)")
    upd: List[tuple] = []
    gathered: List[tuple] = []
    for i, p in enumerate(trainer._params):
        if p.grad_req == "null":
            continue
        arr = p.list_data()[0]
        if not arr._fresh_grad and not ignore_stale_grad:
            raise UserWarning(
                f"Gradient of Parameter `{p.name}` on context {arr.context} has not been "
                f"updated by backward since last `step`. This could mean a bug in your model "
                f"that made it only use a subset of the Parameters (Blocks) for this "
                f"iteration. If you are intentionally only using a subset, call step with "
                f"ignore_stale_grad=True to suppress this warning and skip updating of "
                f"Parameters with stale gradient")
        if not _sharded(p):
            if arr._fresh_grad:
                upd.append((i, p.list_grad()[0], arr))
            arr._fresh_grad = False
            continue
        if i not in trainer._shards:
            trainer._shards[i] = shard_range(arr.size, trainer._process_set)
        lo, hi = trainer._shards[i]
        if arr._fresh_grad and hi > lo:
            g, w = _views(p, lo, hi)
            upd.append((i, g, w))
        arr._fresh_grad = False
        gathered.append((i, arr))
    if upd:
        idx, grads, weights = zip(*upd)
        trainer._updaters[0](list(idx), list(grads), list(weights))
    for i, arr in gathered:
        shard_allgather_(arr, name=f"{trainer._prefix}{i}.w", priority=-i,
                         process_set=trainer._process_set)


def refuse_states(what: str) -> None:
    raise ValueError(
        f"kolo: DistributedTrainer(sharded_update=True).{what}: each rank holds the optimizer "
        f"state of its own share of every parameter only, so no rank has a whole state to "
        f"{'save' if what == 'save_states' else 'load'}; use sharded_update=False where the "
        f"optimizer state must be checkpointed")
