"""Horovod's MXNet training API: ``DistributedOptimizer`` (module API and
any ``mx.optimizer.Optimizer``), ``DistributedTrainer`` (gluon) and
``broadcast_parameters``."""

from __future__ import annotations

import types
import warnings
from collections import defaultdict
from typing import Any, List, Optional

import mxnet as mx

from kolo.common.basics import ProcessSet, Sum, global_process_set, process_set_comm

from . import sharded
from .compression import Compression
from .ops import allreduce_, broadcast_, grouped_allreduce_


def _set_size(process_set: ProcessSet, what: str) -> int:
    comm = process_set_comm(process_set, what)
    if comm is not None:
        return comm.size()
    import kolo
    return kolo.size()


def _split(items: List[Any], groups: int) -> List[List[Any]]:
    """``items`` in ``groups`` consecutive parts of (nearly) equal length."""
    q, r = divmod(len(items), groups)
    out, at = [], 0
    for g in range(groups):
        n = q + (1 if g < r else 0)
        out.append(items[at:at + n])
        at += n
    return [g for g in out if g]


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an MXNet optimizer: every gradient is summed over the ranks (in
    place, on MXNet's engine) before the wrapped optimizer's update, and
    ``rescale_grad`` is divided by the number of ranks, so the update sees the
    average (Horovod's arrangement: no extra pass over the gradients)."""

    def __init__(self, optimizer: Any, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, process_set: ProcessSet = global_process_set):
        self._optimizer = optimizer
        self._size = _set_size(process_set, "DistributedOptimizer")
        self._optimizer.rescale_grad *= (gradient_predivide_factor / self._size)
        self._gradient_predivide_factor = gradient_predivide_factor
        self._num_groups = num_groups
        self._process_set = process_set

    def __getattr__(self, item: str) -> Any:
        return getattr(self._optimizer, item)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def _do_allreduce(self, index, grad):
        if self._size == 1:
            return
        pre = 1.0 / self._gradient_predivide_factor
        if isinstance(index, (tuple, list)):
            if self._num_groups > 0:
                for i, (idx, gs) in enumerate(zip(_split(list(index), self._num_groups),
                                                  _split(list(grad), self._num_groups))):
                    grouped_allreduce_(gs, name=f"{idx[0]}:{idx[-1]}", priority=-i,
                                       prescale_factor=pre, process_set=self._process_set,
                                       op=Sum)
            else:
                for i in range(len(index)):
                    allreduce_(grad[i], name=str(index[i]), priority=-i, prescale_factor=pre,
                               process_set=self._process_set, op=Sum)
        else:
            allreduce_(grad, name=str(index), prescale_factor=pre,
                       process_set=self._process_set, op=Sum)

    def update(self, index, weight, grad, state):
        self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """A ``gluon.Trainer`` without a kvstore whose gradients are summed over
    the ranks by parameter (name ``<prefix><index>``, priority ``-index``;
    with ``num_groups``, in that many groups per dtype) before the update,
    with ``rescale_grad`` divided by the number of ranks.

    ``sharded_update=True`` (kolo's, not Horovod's): ``step()`` reduce-scatters
    each gradient, updates this rank's share of each parameter only and
    allgathers the weights (kolo/mxnet/sharded.py): the same bytes as the
    allreduce, 1/N of the update's work, for element-wise optimizers; the
    optimizer state is then held in shards (no ``save_states``)."""

    def __init__(self, params, optimizer, optimizer_params=None,
                 compression: Any = Compression.none, gradient_predivide_factor: float = 1.0,
                 prefix: Optional[str] = None, num_groups: int = 0,
                 process_set: ProcessSet = global_process_set, sharded_update: bool = False):
        self._compression = compression
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer as its "
                          "optimizer; the plain optimizer inside it is used")
        if isinstance(params, mx.gluon.ParameterDict):
            params = [params[k] for k in sorted(params.keys())]
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._kolo_size = _set_size(process_set, "DistributedTrainer")
        self._scale *= (gradient_predivide_factor / self._kolo_size)
        self._gradient_predivide_factor = gradient_predivide_factor
        if prefix is not None and not isinstance(prefix, str):
            raise TypeError(f"kolo: DistributedTrainer prefix must be a str, not "
                            f"{type(prefix).__name__}")
        self._prefix = prefix or ""
        self._num_groups = num_groups
        self._process_set = process_set
        self._sharded = bool(sharded_update) and self._kolo_size > 1
        self._shards: dict = {}
        if self._sharded:
            sharded.check_optimizer(self._optimizer)

    def step(self, batch_size, ignore_stale_grad=False):
        if not self._sharded:
            return super().step(batch_size, ignore_stale_grad)
        self._check_and_rescale_grad(self._scale / batch_size)
        if not self._kv_initialized:
            self._init_kvstore()
        if self._params_to_init:
            self._init_params()
        sharded.reducescatter_grads(self)
        sharded.update(self, ignore_stale_grad)

    def _update(self, ignore_stale_grad=False):
        # update() after allreduce_grads(): whole gradients, shares updated
        if self._sharded:
            return sharded.update(self, ignore_stale_grad)
        return super()._update(ignore_stale_grad)

    def save_states(self, fname):
        if self._sharded:
            sharded.refuse_states("save_states")
        return super().save_states(fname)

    def load_states(self, fname):
        if self._sharded:
            sharded.refuse_states("load_states")
        return super().load_states(fname)

    def _allreduce_grads(self):
        if self._kolo_size == 1:
            return
        pre = 1.0 / self._gradient_predivide_factor
        entries = [(p.list_grad()[0], self._prefix + str(i))
                   for i, p in enumerate(self._params) if p.grad_req != "null"]
        if self._num_groups > 0:
            for g, group in enumerate(_split(entries, self._num_groups)):
                by_dtype = defaultdict(list)
                for grad, name in group:
                    by_dtype[grad.dtype].append((grad, name))
                for same in by_dtype.values():
                    self._reduce([x for x, _ in same], f"{same[0][1]}:{same[-1][1]}", -g, pre)
            return
        for i, (grad, name) in enumerate(entries):
            self._reduce([grad], name, -i, pre)

    def _reduce(self, grads: List[Any], name: str, priority: int, pre: float) -> None:
        pairs = [self._compression.compress(g) for g in grads]
        sent = [c for c, _ in pairs]
        grouped_allreduce_(sent, name=name, priority=priority, prescale_factor=pre,
                           process_set=self._process_set, op=Sum)
        if self._compression is not Compression.none:
            for g, c, (_, ctx) in zip(grads, sent, pairs):
                g[:] = self._compression.decompress(c, ctx)


def _broadcast_after_init(param: Any, root_rank: int, name: str, process_set: ProcessSet):
    init_impl = param._init_impl

    def wrapped(self, *args, **kwargs):
        init_impl(*args, **kwargs)
        broadcast_(self.data(), root_rank=root_rank, name=name, process_set=process_set)
    return wrapped


def broadcast_parameters(params: Any, root_rank: int = 0, prefix: Optional[str] = None,
                         process_set: ProcessSet = global_process_set) -> None:
    """Rank ``root_rank``'s parameters on every rank, in place: a dict of
    NDArrays (``Module.get_params()``) or a gluon ``ParameterDict``, in the
    order of their sorted names. A gluon parameter whose initialisation is
    deferred is broadcast once it is initialised."""
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"kolo: broadcast_parameters prefix must be a str, not "
                        f"{type(prefix).__name__}")
    prefix = prefix or ""
    tensors, names = [], []
    if isinstance(params, dict):
        for k, p in sorted(params.items()):
            tensors.append(p)
            names.append(prefix + str(k))
    elif isinstance(params, mx.gluon.ParameterDict):
        for k, p in sorted(params.items()):
            try:
                tensors.append(p.data())
                names.append(prefix + str(k))
            except mx.gluon.parameter.DeferredInitializationError:
                p._init_impl = types.MethodType(
                    _broadcast_after_init(p, root_rank, prefix + str(k), process_set), p)
    else:
        raise ValueError(f"kolo: broadcast_parameters takes a dict or a gluon ParameterDict, "
                         f"not {type(params).__name__}")
    for t, name in zip(tensors, names):
        broadcast_(t, root_rank=root_rank, name=name, process_set=process_set)
