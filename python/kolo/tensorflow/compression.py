"""Horovod's ``Compression`` on TensorFlow tensors (the spec is
kolo.common.compression's): ``none``, ``fp16``, ``bf16``."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from kolo.common import compression as _common
from kolo.common.compression import Compressor, NoneCompressor


class _TFAdapter(_common.Adapter):
    @staticmethod
    def dtype(tensor: Any) -> tf.DType:
        return tensor.dtype

    @staticmethod
    def is_floating(dtype: Any) -> bool:
        return dtype.is_floating

    @staticmethod
    def wire(name: str) -> tf.DType:
        return getattr(tf, name)

    @staticmethod
    def cast(tensor: Any, dtype: tf.DType) -> tf.Tensor:
        return tf.cast(tensor, dtype)


Compression, FP16Compressor, BF16Compressor = _common.make(_TFAdapter)

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]
