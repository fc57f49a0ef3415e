"""What ``kolo.keras`` (Keras 3, every backend) and ``kolo.tensorflow.keras``
(``tf.keras``: Keras 3, or tf_keras 2.x under ``TF_USE_LEGACY_KERAS=1``)
share, for the Keras module each binds: the DistributedOptimizer, value-level
collectives, ``broadcast_global_variables``, ``load_model``; callbacks and
elastic state live beside it.

Gradients are averaged in the optimizer's ``apply`` (Keras 3) or
``apply_gradients`` (tf_keras), before loss-scale checks, clipping and
weight decay; each backend's gradients go to kolo as one submission
(:mod:`.reduce`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from kolo.common import arrays, util
from kolo.common import variables as V
from kolo.common.basics import Average, kolo_op, op_from, process_set_comm

from . import reduce as R


def is_keras3(keras: Any) -> bool:
    return hasattr(keras.optimizers.Optimizer, "stateless_apply")


def backend_name(keras: Any) -> str:
    return keras.backend.backend() if is_keras3(keras) else "tensorflow"


class _Keras3Distributed:
    """Methods mixed into a subclass of a Keras 3 optimizer's class.

    With ``backward_passes_per_step`` > 1 (``_kolo_defer``) nothing is sent
    in ``apply``: Keras sums the passes in its accumulators, and the sum is
    reduced once, on the update step, where Keras clips it
    (:meth:`_clip_gradients`): one reduction per ``backward_passes_per_step``
    passes, as Horovod's local aggregation."""

    def apply(self, grads, trainable_variables=None):
        if not self._kolo_defer and not getattr(self, "_kolo_reduced", False):
            vs = trainable_variables if trainable_variables is not None else \
                getattr(self, "_trainable_variables", [None] * len(grads))
            grads = self._kolo_reduce(list(grads), list(vs))
        return super(self._kolo_cls, self).apply(grads, trainable_variables)

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        if not self._kolo_defer:
            grads = self._kolo_reduce(list(grads), list(self._trainable_variables))
        self._kolo_reduced = True
        try:
            return super(self._kolo_cls, self).stateless_apply(optimizer_variables, grads,
                                                               trainable_variables)
        finally:
            self._kolo_reduced = False

    def _backend_apply_gradients(self, grads, trainable_variables):
        # the names for _clip_gradients; past Keras's __setattr__, which
        # would track these variables as the optimizer's own
        object.__setattr__(self, "_kolo_vars", list(trainable_variables))
        return super(self._kolo_cls, self)._backend_apply_gradients(grads, trainable_variables)

    def _clip_gradients(self, grads):
        if self._kolo_defer:
            # tensorflow and torch call this only on the update step (inside
            # Keras's cond); jax on every pass, and its callback sends only
            # when `update` is true: every rank agrees, iterations are equal
            update = (self._iterations + 1) % self.gradient_accumulation_steps == 0
            grads = self._kolo_reduce(list(grads), self._kolo_vars, update)
        return super(self._kolo_cls, self)._clip_gradients(grads)


class _LegacyDistributed:
    """Methods mixed into a subclass of a tf_keras optimizer's class."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        grads = self._kolo_reduce([g for g, _ in pairs], [v for _, v in pairs])
        return super(self._kolo_cls, self).apply_gradients(
            list(zip(grads, [v for _, v in pairs])), *args, **kwargs)


def create_distributed_optimizer(keras: Any, optimizer: Any, name: Optional[str],
                                 compression: Any, sparse_as_dense: bool,
                                 gradient_predivide_factor: float, op: int,
                                 backward_passes_per_step: int,
                                 average_aggregated_gradients: bool, process_set: Any) -> Any:
    """A new optimizer of a subclass of ``optimizer``'s class (same name, same
    config) whose gradients are averaged over every rank before they are
    applied."""
    process_set_comm(process_set, "DistributedOptimizer")  # added, and this rank in it
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"kolo: DistributedOptimizer wraps a {keras.__name__} optimizer, not a "
                        f"{type(optimizer).__name__} (torch optimizers: kolo.torch)")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("kolo: gradient_predivide_factor is only supported with op=Average")
    kolo_op(op)
    keras3 = is_keras3(keras)
    config = optimizer.get_config()
    post = 1.0
    if backward_passes_per_step > 1:
        if not keras3:
            raise NotImplementedError(
                "kolo: backward_passes_per_step > 1 needs Keras 3 (it maps onto the "
                "optimizer's gradient_accumulation_steps); tf_keras optimizers are not supported")
        config["gradient_accumulation_steps"] = backward_passes_per_step
        if not average_aggregated_gradients:
            post = float(backward_passes_per_step)  # Horovod sums the passes
    # A LossScaleOptimizer skips a pass whose local gradients are not finite:
    # its passes are reduced one by one, so that every rank skips the same ones
    defer = backward_passes_per_step > 1 and not hasattr(optimizer, "inner_optimizer")
    mixin = _Keras3Distributed if keras3 else _LegacyDistributed
    base = type(optimizer)
    cls = type(base.__name__, (base,), {k: v for k, v in mixin.__dict__.items()
                                        if k not in ("__dict__", "__weakref__")})
    opt = cls.from_config(config)
    opt._kolo_cls = cls
    opt._kolo_reduced = False
    opt._kolo_defer = defer
    object.__setattr__(opt, "_kolo_vars", [])
    opt._kolo_reduce = R.reducer(backend_name(keras), "DistributedOptimizer", op, compression,
                                 sparse_as_dense, gradient_predivide_factor, post, process_set)
    return opt


# ---- value-level collectives (numpy in, numpy out) ------------------------------


def allreduce(value: Any, name: Optional[str] = None, average: Optional[bool] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: Optional[int] = None) -> np.ndarray:
    """``value`` (an array, a backend tensor or a number) reduced over every
    rank (default: averaged), as a numpy array."""
    op = op_from(op, average)
    a = arrays.contiguous(np.array(V.value(value)))
    return arrays.allreduce(a, util.op_name("allreduce", name), kolo_op(op), prescale_factor,
                            postscale_factor).wait()


def allgather(value: Any, name: Optional[str] = None) -> np.ndarray:
    a = arrays.contiguous(np.array(V.value(value)))
    return arrays.allgather(a, util.op_name("allgather", name)).wait()[0]


def broadcast(value: Any, root_rank: int, name: Optional[str] = None) -> np.ndarray:
    a = arrays.contiguous(np.array(V.value(value)))
    return arrays.broadcast(a, util.root(root_rank), util.op_name("broadcast", name)).wait()


def reducescatter(value: Any, name: Optional[str] = None, op: int = Average) -> np.ndarray:
    a = arrays.contiguous(np.array(V.value(value)))
    return arrays.reducescatter(a, util.op_name("reducescatter", name), kolo_op(op)).wait()


def broadcast_model(model: Any, root_rank: int, optimizer: Any = None) -> None:
    """Assigns rank ``root_rank``'s model variables and optimizer variables
    (those built so far) on every rank."""
    opt = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    vs = list(model.variables) + V.optimizer_variables(opt, shared=True)
    V.broadcast(vs, util.root(root_rank), "broadcast_global_variables")


def load_model(keras: Any, wrap: Callable[[Any], Any], filepath: str,
               custom_optimizers: Any = None, custom_objects: Any = None) -> Any:
    """``keras.models.load_model`` whose optimizer comes back wrapped in a
    DistributedOptimizer (``wrap``)."""
    model = keras.models.load_model(filepath, custom_objects=custom_objects)
    opt = getattr(model, "optimizer", None)
    if opt is not None and not hasattr(opt, "_kolo_reduce"):
        wrapped = wrap(opt)
        if opt.variables and hasattr(wrapped, "build"):
            wrapped.build(model.trainable_variables)
            V.assign(V.optimizer_variables(wrapped), V.values(V.optimizer_variables(opt)))
        model.optimizer = wrapped
    return model


__all__ = ["create_distributed_optimizer", "allreduce", "allgather", "broadcast",
           "reducescatter", "broadcast_model", "load_model"]
