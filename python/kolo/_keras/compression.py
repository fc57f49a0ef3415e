"""``Compression`` for Keras 3 on every backend: casts through
``keras.ops``, so the same compressor serves TensorFlow, torch and jax
gradients (the spec is kolo.common.compression's)."""

from __future__ import annotations

from typing import Any

from kolo.common import compression as _common


class _KerasOpsAdapter(_common.Adapter):
    @staticmethod
    def dtype(tensor: Any) -> str:
        import keras
        return keras.backend.standardize_dtype(tensor.dtype)

    @staticmethod
    def is_floating(dtype: Any) -> bool:
        return "float" in str(dtype)

    @staticmethod
    def wire(name: str) -> str:
        return name

    @staticmethod
    def cast(tensor: Any, dtype: str) -> Any:
        import keras
        return keras.ops.cast(tensor, dtype)


Compression, FP16Compressor, BF16Compressor = _common.make(_KerasOpsAdapter)
