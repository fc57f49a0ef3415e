"""Gradient compression for the collectives: Horovod's ``Compression``, on
torch tensors (the spec is kolo.common.compression's)."""

from __future__ import annotations

from typing import Any

import torch

from kolo.common import compression as _common
from kolo.common.compression import Compressor, NoneCompressor


class _TorchAdapter(_common.Adapter):
    @staticmethod
    def dtype(tensor: torch.Tensor) -> torch.dtype:
        return tensor.dtype

    @staticmethod
    def is_floating(dtype: Any) -> bool:
        return dtype.is_floating_point

    @staticmethod
    def wire(name: str) -> torch.dtype:
        return getattr(torch, name)

    @staticmethod
    def cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return tensor.to(dtype)


Compression, FP16Compressor, BF16Compressor = _common.make(_TorchAdapter)

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]
