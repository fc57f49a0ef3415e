"""Elastic TensorFlow training: Horovod's ``horovod.tensorflow.elastic``.

``run`` is kolo.common.elastic's reset loop; the states keep variables as
numpy copies in host memory (kolo.common.variables), restore them after a
failure, and broadcast rank 0's after every re-form.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from kolo import MembershipError as HorovodInternalError  # noqa: F401
from kolo.common import variables as V
from kolo.common.elastic import HostsUpdatedInterrupt, ObjectState, State, run  # noqa: F401

__all__ = ["run", "State", "ObjectState", "TensorFlowState", "TensorFlowKerasState",
           "HostsUpdatedInterrupt", "HorovodInternalError"]


class _VariablesState(ObjectState):
    """Saves, restores and syncs a list of variables, plus plain values."""

    def _variables(self) -> Sequence[Any]:
        raise NotImplementedError

    def __init__(self, **kwargs: Any):
        self._saved_vars = None
        super().__init__(**kwargs)
        self._saved_vars = V.values(self._variables())

    def save(self) -> None:
        self._saved_vars = V.values(self._variables())
        super().save()

    def restore(self) -> None:
        V.assign(self._variables(), self._saved_vars)
        super().restore()

    def sync(self) -> None:
        V.broadcast(self._variables(), 0, "elastic.state")
        super().sync()


class TensorFlowState(_VariablesState):
    """``TensorFlowState(variables=None, session=None, **kwargs)``: a list of
    tf.Variables and plain values (``state.epoch``)."""

    def __init__(self, variables: Optional[Sequence[Any]] = None, session: Any = None,
                 **kwargs: Any):
        object.__setattr__(self, "variables", list(variables or []))
        super().__init__(**kwargs)

    def _variables(self) -> Sequence[Any]:
        return self.variables


class TensorFlowKerasState(_VariablesState):
    """``TensorFlowKerasState(model, optimizer=None, backend=None, **kwargs)``:
    a Keras model's variables and its optimizer's (the model's own optimizer
    when none is given), and plain values. Works on Keras 3 (every backend)
    and tf_keras."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None,
                 **kwargs: Any):
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "optimizer", optimizer)
        super().__init__(**kwargs)

    def _variables(self) -> Sequence[Any]:
        opt = self.optimizer if self.optimizer is not None else \
            getattr(self.model, "optimizer", None)
        return list(self.model.variables) + V.optimizer_variables(opt)
