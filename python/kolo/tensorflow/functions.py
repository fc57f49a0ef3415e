"""Horovod's TensorFlow helpers: ``broadcast_variables`` and the object
collectives (kolo.common.objects)."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

from kolo.common import objects
from kolo.common.basics import ProcessSet, check_process_set, global_process_set
from kolo.common.basics import process_set_comm

from . import mpi_ops


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int,
                        process_set: ProcessSet = global_process_set,
                        inplace: bool = True) -> Any:
    """Assigns rank ``root_rank``'s values to ``variables`` on every rank,
    all submitted together (eager: done on return; in a graph: the op)."""
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    values = mpi_ops.broadcast_(variables, root_rank, name="broadcast_variables",
                                process_set=process_set)
    return None if tf.executing_eagerly() else tf.group(values)


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None,
                     name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Rank ``root_rank``'s ``obj`` (pickled) on every rank."""
    return objects.broadcast_object(obj, root_rank, name,
                                    process_set_comm(process_set, "broadcast_object"))


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set) -> Callable:
    """Decorator: the function runs on ``root_rank``; every rank gets its
    result."""
    check_process_set(process_set, "broadcast_object_fn")
    return objects.broadcast_object_fn(root_rank, name)


def allgather_object(obj: Any, session: Any = None, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Every rank's ``obj``, in rank order."""
    check_process_set(process_set, "allgather_object")
    return objects.allgather_object(obj, name)
