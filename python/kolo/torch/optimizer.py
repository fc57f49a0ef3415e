"""kolo.torch.DistributedOptimizer: Horovod's gradient-averaging optimizer.

``DistributedOptimizer(opt, named_parameters=model.named_parameters())``
returns an optimizer of a class derived from ``type(opt)`` (same
``param_groups``, same hyperparameters) whose ``step()`` first averages every
gradient over the job. Each gradient's allreduce starts from a hook on the
parameter as soon as backward has accumulated its gradient
(``Tensor.register_post_accumulate_grad_hook``, torch >= 2.1; the gradient
accumulator's hook before that), so communication overlaps the rest of the
backward pass; ``step()`` (or ``synchronize()``) waits for them.

Every rank builds the optimizer over the same parameters, with the same
names, and calls ``backward``/``step`` the same number of times: the
allreduces are named after the parameters, and kolo matches them by name
across ranks.
"""

from __future__ import annotations

import os
import warnings
import weakref
from contextlib import contextmanager
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

import kolo
from kolo.common import basics as _basics

from . import mpi_ops
from .compression import Compression

__all__ = ["DistributedOptimizer"]


def _split_list(items: Sequence[Any], n: int) -> List[List[Any]]:
    """``items`` in n consecutive chunks whose lengths differ by at most one
    (the first ``len % n`` chunks are one longer)."""
    d, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + d + (1 if i < r else 0)
        out.append(list(items[start:end]))
        start = end
    return out


# Horovod's default argument; kolo has no other process set.
_GLOBAL_PROCESS_SET = getattr(mpi_ops, "global_process_set", None)


# Every DistributedOptimizer of the process, for kolo.torch.elastic to reset
# after a re-form.
_live: "weakref.WeakSet" = weakref.WeakSet()


def _reset_after_reform() -> None:
    """Called by kolo.torch.elastic after kolo.reform(): every
    DistributedOptimizer forgets its pending allreduces (their handles
    belonged to the old round), resets its accumulation counters and zeroes
    its gradients (they belong to a step that did not finish)."""
    for opt in list(_live):
        opt._kolo_reset_pending()
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.zero_()


def _elastic_job() -> bool:
    if os.environ.get("KOLO_ELASTIC") == "1" or os.environ.get("HOROVOD_ELASTIC") == "1":
        return True
    return kolo.elastic_enabled()


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods that ``DistributedOptimizer`` puts in front of the user's
    optimizer class. Never instantiated itself: its ``__dict__`` is copied
    into a class derived from the user's optimizer class, whose methods are
    reached through ``self._kolo_base``."""

    _kolo_base: type = torch.optim.Optimizer

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense):
        self._kolo_base.__init__(self, params)
        self._compression = compression

        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"allreduce.noname.{i}.{j}", v)
                                for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) or len(p) != 2 for p in named_parameters):
            raise ValueError("kolo: named_parameters must be a sequence of (name, parameter) "
                             "tuples, as model.named_parameters() returns")
        for name, _ in named_parameters:
            if not isinstance(name, str) or not name:
                raise ValueError(f"kolo: parameter names must be non-empty strings, not "
                                 f"{name!r}")
        seen: set = set()
        dups = sorted({k for k, _ in named_parameters if k in seen or seen.add(k)})
        if dups:
            raise ValueError("kolo: parameter names in named_parameters must be unique; "
                             f"duplicates: {', '.join(dups)}")
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        named_ids = {id(v) for _, v in named_parameters}
        unnamed = [(gi, pi) for gi, group in enumerate(self.param_groups)
                   for pi, v in enumerate(group["params"]) if id(v) not in named_ids]
        if unnamed:
            where = ", ".join(f"param_groups[{g}]['params'][{i}]" for g, i in unnamed[:8])
            raise ValueError("kolo: named_parameters was given but does not name every "
                             f"parameter of the optimizer ({len(unnamed)} unnamed: {where}"
                             f"{', ...' if len(unnamed) > 8 else ''})")
        # Names of parameters the optimizer does not hold are ignored.
        self._parameter_names: Dict[torch.Tensor, str] = {
            v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])
            if id(v) in all_ids}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay: Dict[torch.Tensor, int] = {
            v: backward_passes_per_step for v in self._parameter_names}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = _GLOBAL_PROCESS_SET

        self._handles: Dict[Any, Tuple[Any, Any]] = {}
        self._grad_accs: list = []
        self._requires_update: set = set()
        self._synchronized = False
        self._should_synchronize = True

        if groups is not None:
            if isinstance(groups, bool) or not (isinstance(groups, list) or
                                                (isinstance(groups, int) and groups > 0)):
                raise ValueError("kolo: groups must be a positive integer or a list of lists "
                                 "of parameters")
            if isinstance(groups, list):
                grouped: set = set()
                for members in groups:
                    for p in members:
                        if not isinstance(p, torch.Tensor):
                            raise ValueError("kolo: groups must consist of torch.Tensor "
                                             "parameters")
                        if id(p) in grouped:
                            raise ValueError("kolo: a parameter can appear only once in "
                                             "groups")
                        grouped.add(id(p))
        self._groups = groups
        self._p_to_group: Dict[torch.Tensor, tuple] = {}
        self._group_counts: Dict[tuple, int] = {}

        # Adasum reduces the step's parameter deltas in step(), not the
        # gradients as they come (Horovod's _DistributedAdasumOptimizer).
        if op != mpi_ops.Adasum and (mpi_ops.size() > 1 or _elastic_job()):
            self._register_hooks()
        _live.add(self)

    # ---- state ----------------------------------------------------------

    def load_state_dict(self, *args, **kwargs):
        """The wrapped optimizer's ``load_state_dict``; pending allreduces
        are forgotten and the accumulation counters reset (as after a
        restore in an elastic job)."""
        self._kolo_reset_pending()
        return self._kolo_base.load_state_dict(self, *args, **kwargs)

    def _kolo_reset_pending(self) -> None:
        """Forgets every pending allreduce and resets the accumulation
        counters. Called by load_state_dict and by kolo.torch.elastic after
        a re-form (the handles of the old round are void)."""
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        for g in self._group_counts:
            self._group_counts[g] = 0

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Changes ``backward_passes_per_step`` (every rank alike) and
        resets the accumulation counters."""
        if not isinstance(passes, int) or passes <= 0:
            raise ValueError(f"kolo: backward_passes_per_step must be a positive integer, not "
                             f"{passes!r}")
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    # ---- hooks ----------------------------------------------------------

    def _register_hooks(self) -> None:
        if self._groups is not None:
            plist = [p for group in self.param_groups for p in group["params"]
                     if p.requires_grad]
            if not _elastic_job():
                # Horovod's rule: every rank forms the groups in rank 0's
                # parameter order. (Not in an elastic job: a joiner builds its
                # optimizer while the others sync, and any collective there
                # would be out of step; the program's order is used.)
                from .functions import broadcast_object
                order = broadcast_object([self._parameter_names[p] for p in plist],
                                         root_rank=0)
                pos = {n: i for i, n in enumerate(order)}
                plist.sort(key=lambda p: pos.get(self._parameter_names[p], len(pos)))
            if isinstance(self._groups, list):
                ids = {id(p) for p in plist}
                pgroups, done = [], set()
                for members in self._groups:
                    g = [p for p in members if id(p) in ids]
                    if g:
                        pgroups.append(g)
                    done.update(id(p) for p in g)
                pgroups += [[p] for p in plist if id(p) not in done]
            else:
                pgroups = [g for g in _split_list(plist, self._groups) if g]
            for g in pgroups:
                t = tuple(g)
                for p in t:
                    self._p_to_group[p] = t
                self._group_counts[t] = 0
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    hook = self._make_hook(p)
                    if hasattr(p, "register_post_accumulate_grad_hook"):
                        self._grad_accs.append(
                            p.register_post_accumulate_grad_hook(lambda _p, h=hook: h()))
                    else:  # torch < 2.1: the gradient accumulator's hook
                        acc = p.expand_as(p).grad_fn.next_functions[0][0]
                        acc.register_hook(hook)
                        self._grad_accs.append(acc)

    def _scales(self) -> Tuple[float, float]:
        if self.op == mpi_ops.Average:
            # The 1/size of the average is applied by kolo after the sum.
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _dense_grad(self, p: torch.Tensor) -> torch.Tensor:
        if p.grad is None:
            # No gradient on this rank (a branch its forward did not take):
            # the others may have one, so zeros are submitted.
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        g = p.grad
        if g.is_sparse and (self.sparse_as_dense or self._groups is not None):
            g = g.to_dense()
        return g

    def _allreduce_grad_async(self, p: torch.Tensor):
        tensor = self._dense_grad(p)
        if tensor.is_sparse:
            # Horovod's path for sparse gradients: an allgather of every
            # rank's indices and values (duplicates add up); a callable.
            return mpi_ops.sparse_allreduce_async(tensor.coalesce(),
                                                  self._parameter_names.get(p), self.op,
                                                  self.process_set), None
        compressed, ctx = self._compression.compress(tensor)
        pre, post = self._scales()
        handle = mpi_ops.allreduce_async_(compressed, name=self._parameter_names.get(p),
                                          op=self.op, prescale_factor=pre,
                                          postscale_factor=post, process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, ps: tuple):
        tensors = [self._dense_grad(p) for p in ps]
        compressed, ctxs = zip(*[self._compression.compress(t) for t in tensors])
        pre, post = self._scales()
        handle = mpi_ops.grouped_allreduce_async_(list(compressed),
                                                  name=self._parameter_names.get(ps[0]),
                                                  op=self.op, prescale_factor=pre,
                                                  postscale_factor=post,
                                                  process_set=self.process_set)
        return handle, ctxs

    def _make_hook(self, p: torch.Tensor):
        def hook(*ignore):
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "Gradients were computed more than backward_passes_per_step times "
                        "before call to step(). Increase backward_passes_per_step to "
                        "accumulate gradients locally.")
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                if self._groups is not None:
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        handle, ctxs = self._grouped_allreduce_grad_async(group)
                        self._handles[group] = (handle, ctxs)
                        for gp in group:
                            self._handles.pop(gp, None)
                        self._group_counts[group] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    # ---- synchronize / step ---------------------------------------------

    def synchronize(self) -> None:
        """Waits for every gradient's allreduce and leaves the averaged
        gradients in ``p.grad``. Every rank calls it (or ``step()``) after
        the same number of backward passes. Parameters whose gradient was not
        computed on this rank (``p.grad is None``) take part with zeros, so
        that ranks whose forward graphs differ do not stall; gradients whose
        accumulation is incomplete (fewer backward passes than
        ``backward_passes_per_step``) are reduced as they are. Raises
        HorovodInternalError (kolo.MembershipError) when the job's membership
        changed.

        With ``groups``, a group whose allreduce has not started (a member
        got no gradient, or fewer backward passes than configured) is
        reduced as a group too, so that its names match those of the ranks
        where it started from the hooks. With ``op=Adasum`` there is nothing
        to synchronize: ``step()`` reduces the parameters' changes."""
        if self.op == mpi_ops.Adasum:
            self._synchronized = True
            return
        if self._groups is not None:
            for group in self._group_counts:
                if group in self._handles:
                    continue
                for gp in group:
                    self._handles.pop(gp, None)
                self._handles[group] = self._grouped_allreduce_grad_async(group)
                self._group_counts[group] = 0
        completed: set = set()
        for key in self._handles:
            if isinstance(key, tuple):
                completed.update(key)
            else:
                completed.add(key)
        # Sorted by name: every rank submits the missing ones in one order.
        missing = sorted(self._requires_update - completed,
                         key=lambda q: self._parameter_names.get(q, ""))
        for p in missing:
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if isinstance(p, tuple):
                outputs = mpi_ops.synchronize(handle)
                for gp, out, gctx in zip(p, outputs, ctx):
                    self._allreduce_delay[gp] = self.backward_passes_per_step
                    self._set_grad(gp, self._compression.decompress(out, gctx))
                if self._group_counts.get(p):
                    self._group_counts[p] = 0
            else:
                out = handle() if callable(handle) else mpi_ops.synchronize(handle)
                self._allreduce_delay[p] = self.backward_passes_per_step
                if self._groups is not None:
                    group = self._p_to_group[p]
                    if self._group_counts[group]:
                        self._group_counts[group] = 0
                self._set_grad(p, out if out.is_sparse else
                               self._compression.decompress(out, ctx))
            del self._handles[p]
        self._handles.clear()
        self._synchronized = True

    def _adasum_step(self, base_step, closure, kwargs):
        """Horovod's Adasum optimizer: the wrapped optimizer's step on this
        rank's own gradients, then each parameter's change in that step is
        replaced by the Adasum of every rank's change (one allreduce per
        parameter, so the dot products are per parameter, in name order)."""
        params = sorted((p for g in self.param_groups for p in g["params"] if p.requires_grad),
                        key=lambda q: self._parameter_names.get(q, ""))
        with torch.no_grad():
            starts = [p.detach().clone() for p in params]
        result = base_step(self, closure, **kwargs)
        with torch.no_grad():
            pending = []
            for p, start in zip(params, starts):
                delta, ctx = self._compression.compress((p.detach() - start).contiguous())
                name = self._parameter_names.get(p)
                pending.append((p, start, ctx, mpi_ops.allreduce_async_(
                    delta, name=f"adasum.{name}" if name else None, op=mpi_ops.Adasum,
                    process_set=self.process_set)))
            for p, start, ctx, handle in pending:
                delta = self._compression.decompress(mpi_ops.synchronize(handle), ctx)
                p.copy_(start + delta)
        return result

    @staticmethod
    def _set_grad(p: torch.Tensor, value: torch.Tensor) -> None:
        if p.grad.is_sparse:
            if not value.is_sparse:
                value = value.to_sparse()
            p.grad.zero_().add_(value)
        elif value is not p.grad:
            p.grad.set_(value)

    @contextmanager
    def skip_synchronize(self):
        """A context in which ``step()`` does not synchronize: for programs
        that call ``synchronize()`` themselves to modify the averaged
        gradients first (clipping, AMP unscaling)::

            loss.backward()
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None, **kwargs):
        """Synchronizes (unless inside ``skip_synchronize()``), then the
        wrapped optimizer's step. Every rank calls it. Keyword arguments go
        to the wrapped step (``GradScaler`` passes some to optimizers that
        set ``_step_supports_amp_scaling``)."""
        base_step = self._kolo_base.step
        if getattr(base_step, "hooked", False) and hasattr(base_step, "__wrapped__"):
            base_step = base_step.__wrapped__
        if self.op == mpi_ops.Adasum:
            return self._adasum_step(base_step, closure, kwargs)
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        # Optimizer.__init__ wraps each class's step once to run the step
        # hooks; this class's step is wrapped too, so the base's wrapper (set
        # aside above) is skipped: the hooks run once per step.
        return base_step(self, closure, **kwargs)

    def zero_grad(self, *args, **kwargs):
        """The wrapped optimizer's ``zero_grad``. Raises AssertionError while
        allreduces are pending (after backward, before step/synchronize):
        they write the gradients being zeroed."""
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return self._kolo_base.zero_grad(self, *args, **kwargs)


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
                         compression=Compression.none,
                         backward_passes_per_step: int = 1,
                         op=mpi_ops.Average,
                         gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0,
                         groups=None,
                         sparse_as_dense: bool = False,
                         process_set=_GLOBAL_PROCESS_SET) -> torch.optim.Optimizer:
    """Wraps ``optimizer`` so that ``step()`` averages (``op``) every
    gradient over the job first.

    Called by every rank after ``kolo.torch.init()``, with the same
    parameters in the same order. Returns a new optimizer of a class derived
    from ``type(optimizer)``, over ``optimizer.param_groups`` (the original's
    state, e.g. momentum buffers, is not carried over).

    Args:
        named_parameters: ``(name, parameter)`` pairs, usually
            ``model.named_parameters()``: the allreduces are named after
            them. Names must be unique and cover every parameter of the
            optimizer (ValueError otherwise). Without them the names are
            ``allreduce.noname.<group>.<index>``, which is right only when
            every rank's optimizer holds the same parameters in one order.
        compression: ``Compression.none`` or ``Compression.fp16``/``bf16``
            (gradients travel in half precision; kolo sums in float32).
        backward_passes_per_step: backward passes whose gradients are summed
            locally (not averaged) before one allreduce; a pass beyond that
            before ``step()`` raises AssertionError.
        op: ``Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product``,
            or ``Adasum``: each rank steps on its own gradients, then every
            parameter's change is the Adasum of the ranks' changes (as
            Horovod's Adasum optimizer; docs/collectives.md, "Adasum").
        gradient_predivide_factor: f splits the average into a 1/f scale
            before the sum and f/size after it; only with ``op=Average``.
        num_groups: deprecated spelling of an integer ``groups``.
        groups: an integer n (the gradients go in n grouped allreduces,
            consecutive parameters together) or a list of lists of
            parameters (each list one grouped allreduce; parameters in no
            list alone).
        sparse_as_dense: sparse gradients are densified for the allreduce
            (and made sparse again); without it they travel as Horovod's
            do, an allgather of every rank's indices and values (Sum or
            Average; with ``groups`` they are densified).
        process_set: the ranks that average their gradients (default: every
            rank); an added ``hvd.ProcessSet`` this rank is in.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"kolo: DistributedOptimizer wraps a torch.optim.Optimizer, not a "
                        f"{type(optimizer).__name__}")
    if op == mpi_ops.Adasum and (groups or num_groups or gradient_predivide_factor != 1.0):
        raise ValueError("kolo: DistributedOptimizer(op=Adasum) reduces parameter deltas one "
                         "by one: groups and gradient_predivide_factor do not apply")
    if process_set is None:
        process_set = _GLOBAL_PROCESS_SET
    _basics.process_set_comm(process_set, "DistributedOptimizer")  # added, and this rank in it
    if gradient_predivide_factor != 1.0 and op != mpi_ops.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if not isinstance(gradient_predivide_factor, (int, float)) or \
            not gradient_predivide_factor > 0 or gradient_predivide_factor == float("inf"):
        raise ValueError(f"kolo: gradient_predivide_factor must be a positive finite number, "
                         f"not {gradient_predivide_factor!r}")
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be "
                      "removed in a later version.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if isinstance(backward_passes_per_step, bool) or \
            not isinstance(backward_passes_per_step, int) or backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise TypeError(f"kolo: compression must be a Compression (none, fp16, bf16), not "
                        f"{compression!r}")
    base = optimizer.__class__
    body = {k: v for k, v in _DistributedOptimizer.__dict__.items()
            if k not in ("__dict__", "__weakref__")}
    body["_kolo_base"] = base
    body["__module__"] = __name__
    body["__doc__"] = base.__doc__
    cls = type(base.__name__, (base,), body)
    new = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
              op, gradient_predivide_factor, groups, sparse_as_dense)
    # What the base's __init__ derived from its arguments, which the new one
    # was not given: the defaults (for add_param_group) and whether step()
    # unscales itself under GradScaler (fused optimizers).
    new.defaults = dict(optimizer.defaults)
    new.process_set = process_set
    for attr in ("_step_supports_amp_scaling",):
        if attr in vars(optimizer):
            setattr(new, attr, getattr(optimizer, attr))
    return new
