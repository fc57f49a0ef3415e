"""Horovod's ``Compression`` on MXNet arrays (the spec is
kolo.common.compression's): ``none`` and ``fp16``, as horovod.mxnet has."""

from __future__ import annotations

from typing import Any

import numpy as np

from kolo.common import compression as _common
from kolo.common.compression import Compressor, NoneCompressor


class _MXAdapter(_common.Adapter):
    @staticmethod
    def dtype(tensor: Any) -> Any:
        return np.dtype(tensor.dtype)

    @staticmethod
    def is_floating(dtype: Any) -> bool:
        return np.issubdtype(np.dtype(dtype), np.floating)

    @staticmethod
    def wire(name: str) -> Any:
        if name != "float16":
            raise NotImplementedError(f"kolo.mxnet: compression to {name} is not supported "
                                      f"(MXNet arrays: none, fp16)")
        return np.dtype(np.float16)

    @staticmethod
    def cast(tensor: Any, dtype: Any) -> Any:
        return tensor.astype(dtype)


Compression, FP16Compressor, _BF16 = _common.make(_MXAdapter)
del Compression.bf16

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]
