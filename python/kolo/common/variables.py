"""Variables of any framework that has ``.numpy()`` and ``.assign()``
(tf.Variable, Keras 3 variables on every backend, tf_keras): read, assign
and broadcast them as numpy arrays, all submitted together."""

from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np

from . import arrays
from .handles import wait_all


def value(v: Any) -> np.ndarray:
    """A copy of ``v``'s value (``v.numpy()`` where callable; else through
    ``__array__``, as Keras 3's jax variables)."""
    fn = getattr(v, "numpy", None)
    if callable(fn):
        return np.array(fn())
    return np.array(getattr(v, "value", v))


def values(variables: Sequence[Any]) -> List[np.ndarray]:
    return [value(v) for v in variables]


def assign(variables: Sequence[Any], vals: Sequence[np.ndarray]) -> None:
    for v, x in zip(variables, vals):
        v.assign(x)


def broadcast(variables: Sequence[Any], root: int, name: str) -> None:
    """Assigns rank ``root``'s values to ``variables`` on every rank (eager)."""
    variables = list(variables)
    if not variables:
        return
    vals = wait_all([arrays.broadcast(arrays.contiguous(value(v)), root, f"{name}.{i}")
                     for i, v in enumerate(variables)])
    assign(variables, vals)


def optimizer_variables(optimizer: Any, shared: bool = False) -> List[Any]:
    """An optimizer's variables: a property in Keras 3, a method in older
    Keras optimizers. ``shared``: only those every rank holds alike, the ones
    to broadcast; a DistributedOptimizer with ``backward_passes_per_step`` > 1
    keeps its gradient accumulators local (each rank's sum of its own passes,
    reduced at the update step)."""
    if optimizer is None:
        return []
    vs = getattr(optimizer, "variables", [])
    vs = list(vs() if callable(vs) else vs)
    if shared and getattr(optimizer, "_kolo_defer", False):
        local = {id(a) for a in getattr(optimizer, "_accumulated_gradients", []) or []}
        vs = [v for v in vs if id(v) not in local]
    return vs
