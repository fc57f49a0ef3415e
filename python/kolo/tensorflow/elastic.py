"""Elastic TensorFlow training: Horovod's ``horovod.tensorflow.elastic``.

``run`` is kolo.common.elastic's reset loop; the states keep variables as
numpy copies in host memory, restore them after a failure, and broadcast
rank 0's after every re-form.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from kolo import MembershipError as HorovodInternalError  # noqa: F401
from kolo.common.elastic import (HostsUpdatedInterrupt, ModelState, ObjectState,  # noqa: F401
                                 State, VariablesState, run)

__all__ = ["run", "State", "ObjectState", "TensorFlowState", "TensorFlowKerasState",
           "HostsUpdatedInterrupt", "HorovodInternalError"]


class TensorFlowState(VariablesState):
    """``TensorFlowState(variables=None, session=None, **kwargs)``: a list of
    tf.Variables and plain values (``state.epoch``)."""

    def __init__(self, variables: Optional[Sequence[Any]] = None, session: Any = None,
                 **kwargs: Any):
        object.__setattr__(self, "variables", list(variables or []))
        super().__init__(**kwargs)

    def _variables(self) -> Sequence[Any]:
        return self.variables


class TensorFlowKerasState(ModelState):
    """``TensorFlowKerasState(model, optimizer=None, backend=None, **kwargs)``."""
