"""Elastic training state: what a worker saves at each commit, restores
after a failure and receives from rank 0 after every re-form.

The state lives in Python (deep copies of ``state_dict()``s and of plain
objects, in host memory for CPU tensors); kolo's own commit point is used
only to learn, in one small allreduce, whether a join or a leave is pending.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

import kolo

from .. import functions, mpi_ops
from .sampler import ElasticSampler

__all__ = ["HostsUpdatedInterrupt", "State", "ObjectState", "TorchState", "StateHandler",
           "ModelStateHandler", "OptimizerStateHandler", "SamplerStateHandler",
           "get_handler_registry", "set_handler_registry"]


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``state.commit()``/``check_host_updates()`` on every rank
    at once when workers wait to join or a worker leaves: ``run`` re-forms
    the job without restoring (the commit just made is current everywhere).

    ``skip_sync`` is Horovod's; kolo always syncs after a re-form, so that
    old and new workers meet in the same broadcasts (Horovod #3494)."""

    def __init__(self, skip_sync: bool = False, left: bool = False):
        self.skip_sync = skip_sync
        self.left = left
        super().__init__("this worker left the job" if left else
                         "the job's membership changes at this commit point")


class State:
    """Training state kept across membership changes. Subclasses define
    ``save`` (to host memory), ``restore`` (the last save) and ``sync``
    (from rank 0). Every rank creates the same state objects and calls
    ``commit()`` at the same points of its training loop."""

    def __init__(self, bcast_object: Callable = None, get_rank: Callable = None):
        self._bcast_object = bcast_object or functions.broadcast_object
        self._rank = get_rank or mpi_ops.rank
        self._reset_callbacks: List[Callable[[], Any]] = []
        self._commit: Optional[kolo.Commit] = None
        self._commit_comm: Any = None

    def register_reset_callbacks(self, callbacks: Sequence[Callable[[], Any]]) -> None:
        """Functions (no arguments) called on every rank after each re-form,
        before the state is synced: e.g. to scale the learning rate with the
        new ``size()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called by ``run`` after a re-form: ``reset()``, then the
        registered callbacks."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Saves the state (``save()``), then checks for a pending join or
        leave (``check_host_updates()``). Every rank calls it at the same
        points; a failure loses the work since the last commit."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """One 8-byte allreduce, called by every rank at the same point:
        raises HostsUpdatedInterrupt on every rank when workers wait to join
        or one leaves (SIGTERM, kolo.elastic_leave()); a peer failure seen
        by this allreduce raises it too (see ``run``). In a job that is not
        elastic it does nothing (no collective)."""
        comm = kolo._get()
        if self._commit is None or self._commit_comm is not comm:
            # A new comm (after shutdown() and init()): a new commit point.
            self._commit = kolo.Commit()
            self._commit_comm = comm
        if self._commit.check():
            raise HostsUpdatedInterrupt(False, left=self._commit.left())

    def _left(self) -> bool:
        return (self._commit is not None and self._commit_comm is kolo._comm and
                self._commit.left())

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def reset(self) -> None:
        """Called after a re-form, before the sync (no-op here)."""


class ObjectState(State):
    """Plain Python values as attributes (``state.epoch``, ``state.batch``):
    deep-copied at ``save()`` and again at ``restore()`` (so a value mutated
    in place after a commit is rolled back too), broadcast from rank 0 with
    ``broadcast_object`` at ``sync()`` (the last saved values).

    ``ObjectState(**kwargs)`` or, as in Horovod,
    ``ObjectState(bcast_object, get_rank, **kwargs)``."""

    def __init__(self, bcast_object: Callable = None, get_rank: Callable = None, **kwargs):
        self._saved_state: Dict[str, Any] = dict(kwargs)
        self._set_attrs()
        State.__init__(self, bcast_object, get_rank)

    def save(self) -> None:
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))


class StateHandler:
    """Saves, restores and syncs one value of a TorchState."""

    def __init__(self, value: Any):
        self.value = value

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def reset(self) -> None:
        """After a re-form, before the sync."""

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """A value with ``state_dict()``/``load_state_dict()``: save keeps a deep
    copy of the state dict, restore loads it back."""

    def __init__(self, value):
        super().__init__(value)
        self._saved = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)


class ModelStateHandler(_StateDictHandler):
    """A torch.nn.Module: a deep copy of ``state_dict()``; sync is
    ``broadcast_parameters(state_dict(), root_rank=0)``."""

    def sync(self) -> None:
        functions.broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    """A torch.optim.Optimizer (a DistributedOptimizer too): a deep copy of
    ``state_dict()``; sync is ``broadcast_optimizer_state(opt, 0)``, which
    first creates lazily made state (Adam's moments) on a worker that has
    none. (After a re-form ``run`` resets every DistributedOptimizer's
    pending allreduces, whether it is in a state or not.)"""

    def sync(self) -> None:
        functions.broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(StateHandler):
    """An ElasticSampler: a copy of ``state_dict()``; sync broadcasts rank
    0's and loads it, which re-partitions for the new membership."""

    def __init__(self, sampler: ElasticSampler):
        super().__init__(sampler)
        self._saved = copy.deepcopy(sampler.state_dict())

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        self.value.load_state_dict(self._bcast(self.value.state_dict()))

    @staticmethod
    def _bcast(obj: Any) -> Any:
        return functions.broadcast_object(obj, root_rank=0)


_handler_registry: List[Tuple[type, type]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> List[Tuple[type, type]]:
    """The (value type, handler class) pairs TorchState consults, in order."""
    return _handler_registry


def set_handler_registry(registry: List[Tuple[type, type]]) -> None:
    global _handler_registry
    _handler_registry = registry


def _handler_for(value: Any) -> Optional[StateHandler]:
    for typ, handler in _handler_registry:
        if isinstance(value, typ):
            return handler(value)
    return None


class TorchState(ObjectState):
    """The state of a PyTorch training loop: ``TorchState(model=None,
    optimizer=None, **kwargs)``. Models, optimizers and ElasticSamplers
    (any keyword) get their handlers; other values are ObjectState
    attributes. Every value is an attribute (``state.model``,
    ``state.epoch``); assigning a handled one replaces it and saves it.

    ``sync()`` broadcasts every value from rank 0 (the handled ones, then
    the plain values); after
    it every rank holds rank 0's state (``run`` then saves it as the last
    commit)."""

    def __init__(self, model: Optional[torch.nn.Module] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers: Dict[str, StateHandler] = {}
        rest: Dict[str, Any] = {}
        for k, v in kwargs.items():
            h = _handler_for(v)
            if h is not None:
                handlers[k] = h
            else:
                rest[k] = v
        object.__setattr__(self, "_handlers", handlers)
        for k, h in handlers.items():
            object.__setattr__(self, k, h.value)
        super().__init__(**rest)

    def save(self) -> None:
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self) -> None:
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def reset(self) -> None:
        for h in self._handlers.values():
            h.reset()
        super().reset()

    def sync(self) -> None:
        for h in self._handlers.values():
            h.sync()
        super().sync()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers:
            handlers[name].set_value(value)
        object.__setattr__(self, name, value)
