"""Elastic training state: what a worker saves at each commit, restores
after a failure and receives from rank 0 after every re-form.

State, ObjectState and HostsUpdatedInterrupt are kolo.common.elastic's;
here are the torch values' handlers and TorchState (deep copies of
``state_dict()``s, in host memory for CPU tensors).
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Tuple

import torch

from kolo.common.elastic import HostsUpdatedInterrupt, ObjectState, State

from .. import functions
from .sampler import ElasticSampler

__all__ = ["HostsUpdatedInterrupt", "State", "ObjectState", "TorchState", "StateHandler",
           "ModelStateHandler", "OptimizerStateHandler", "SamplerStateHandler",
           "get_handler_registry", "set_handler_registry"]


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

    def durable_snapshot(self) -> Any:
        """The last saved value, picklable (a durable commit, docs/durable.md)."""
        raise NotImplementedError(f"{type(self).__name__} has no durable commits")

    def durable_load(self, saved: Any) -> None:
        """Makes ``saved`` (a ``durable_snapshot()``) the saved and current value."""
        raise NotImplementedError(f"{type(self).__name__} has no durable commits")

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

    def durable_snapshot(self) -> Any:
        return self._saved

    def durable_load(self, saved: Any) -> None:
        self._saved = saved
        self.restore()


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


class SamplerStateHandler(_StateDictHandler):
    """An ElasticSampler: a copy of ``state_dict()``; sync broadcasts rank
    0's and loads it, which re-partitions for the new membership."""

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

    def _durable_snapshot(self) -> Any:
        return {"handlers": {k: h.durable_snapshot() for k, h in self._handlers.items()},
                "values": super()._durable_snapshot()}

    def _durable_load(self, obj: Any) -> None:
        for k, h in self._handlers.items():
            h.durable_load(obj["handlers"][k])
        super()._durable_load(obj["values"])

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers:
            handlers[name].set_value(value)
        object.__setattr__(self, name, value)
