"""``SyncBatchNormalization``: batch normalization whose batch statistics
are those of the global batch (every rank's samples), as Horovod's.

Each rank reduces its sum, sum of squares and count in one grouped
allreduce; mean and variance follow from the totals, so ranks with unequal
batch sizes are weighted by their samples. The gradient flows through the
allreduce. A subclass of the running ``tf.keras`` flavour's layer: Keras 3
(``_moments``) or tf_keras (``_calculate_mean_and_var``).
"""

from __future__ import annotations

import tensorflow as tf

from . import mpi_ops


def _global_moments(x, axes, keepdims):
    x32 = tf.cast(x, tf.float32) if x.dtype in (tf.float16, tf.bfloat16) else x
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x32), axes)), x32.dtype)
    s = tf.reduce_sum(x32, axis=axes, keepdims=True)
    sq = tf.reduce_sum(tf.square(x32), axis=axes, keepdims=True)
    s, sq, n = mpi_ops.grouped_allreduce([s, sq, tf.reshape(count, [1])], op=mpi_ops.Sum)
    mean = s / n
    var = tf.maximum(sq / n - tf.square(mean), 0.0)
    if not keepdims:
        mean, var = tf.squeeze(mean, axes), tf.squeeze(var, axes)
    return tf.cast(mean, x.dtype), tf.cast(var, x.dtype)


class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
    """``tf.keras.layers.BatchNormalization`` with global batch statistics in
    training (inference uses the moving statistics, as the base layer)."""

    def __init__(self, **kwargs):
        if kwargs.pop("fused", None):
            raise ValueError("kolo: SyncBatchNormalization does not support fused=True")
        super().__init__(**kwargs)

    # Keras 3
    def _moments(self, inputs, mask):
        if mask is not None or mpi_ops.size() == 1:
            return super()._moments(inputs, mask)
        return _global_moments(inputs, list(self._reduction_axes), keepdims=False)

    # tf_keras
    def _calculate_mean_and_var(self, inputs, reduction_axes, keep_dims, mask=None):
        if mask is not None or mpi_ops.size() == 1:
            return super()._calculate_mean_and_var(inputs, reduction_axes, keep_dims,
                                                   mask=mask)
        return _global_moments(inputs, list(reduction_axes), keepdims=keep_dims)
