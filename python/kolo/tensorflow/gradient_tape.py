"""``DistributedGradientTape`` and ``PartialDistributedGradientTape``:
Horovod's tapes, whose ``gradient()`` returns gradients averaged over every
rank (kolo.tensorflow.gradients)."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import tensorflow as tf

from kolo.common.basics import Average, ProcessSet, global_process_set, process_set_comm

from . import gradients as G
from . import mpi_ops
from .compression import Compression


class _DistributedGradientTape:
    """Methods mixed into a subclass of the wrapped tape's own class."""

    def register_local_source(self, source: Any) -> None:
        """``source``'s gradient stays this rank's own (not reduced); it is
        divided by the size when ``scale_local_gradients``."""
        self._kolo_local.add(id(source))

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 **kwargs):
        flat = tf.nest.flatten(sources)
        grads = tf.nest.flatten(super(self._kolo_cls, self).gradient(
            target, flat, output_gradients, **kwargs))
        shared = [i for i, s in enumerate(flat) if id(s) not in self._kolo_local]
        reduced = G.reduce_gradients([grads[i] for i in shared], [flat[i] for i in shared],
                                     "DistributedGradientTape", **self._kolo_args)
        out = list(grads)
        for i, g in zip(shared, reduced):
            out[i] = g
        if self._kolo_scale_local and len(shared) < len(flat):
            n = float(mpi_ops._size(process_set_comm(self._kolo_args["process_set"],
                                                     "DistributedGradientTape")))
            for i, g in enumerate(out):
                if i not in shared and g is not None:
                    out[i] = (tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                              if isinstance(g, tf.IndexedSlices) else g / n)
        return tf.nest.pack_sequence_as(sources, out)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        grads = self.gradient(target, sources, output_gradients)
        local, shared = [], []
        for s, g in zip(sources, grads):
            (local if id(s) in self._kolo_local else shared).append((s, g))
        return local, shared


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression: Any = Compression.none,
                            sparse_as_dense: bool = False, op: int = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Optional[Any] = None,
                            process_set: ProcessSet = global_process_set,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """The tape ``gradtape`` (after its ``with`` block), as an instance of a
    subclass of its class whose ``gradient()`` averages over every rank.
    ``groups`` is accepted; kolo fuses by size (KOLO_FUSION_THRESHOLD)."""
    process_set_comm(process_set, "DistributedGradientTape")  # added, and this rank in it
    G.check_predivide(op, gradient_predivide_factor)
    G.check_groups(num_groups, groups)
    base = type(gradtape)
    cls = type(base.__name__, (base,), dict(
        (k, v) for k, v in _DistributedGradientTape.__dict__.items()
        if k not in ("__dict__", "__weakref__")))
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the same recorded tape
    tape._kolo_cls = cls
    tape._kolo_local = set()
    tape._kolo_scale_local = scale_local_gradients
    tape._kolo_args = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                           gradient_predivide_factor=gradient_predivide_factor,
                           process_set=process_set)
    return tape


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "",
                                   compression: Any = Compression.none,
                                   sparse_as_dense: bool = False, op: int = Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: Optional[Any] = None,
                                   process_set: ProcessSet = global_process_set,
                                   local_layers: Optional[Iterable[Any]] = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """DistributedGradientTape whose ``local_layers``' trainable weights keep
    their own gradients."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    if local_layers is None:
        local_layers = []
    elif hasattr(local_layers, "trainable_weights"):
        local_layers = [local_layers]
    for layer in local_layers:
        if not hasattr(layer, "trainable_weights"):
            raise ValueError("kolo: every local layer must be a Keras layer")
        for v in layer.trainable_weights:
            tape.register_local_source(v)
    return tape
