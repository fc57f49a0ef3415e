"""Gradient compression for the collectives: Horovod's ``Compression``.

A compressor turns a tensor into the tensor that travels and a context, and
back: ``compressed, ctx = C.compress(t)`` before the collective,
``C.decompress(result, ctx)`` after it. ``Compression.fp16`` and
``Compression.bf16`` send floating-point tensors as 16-bit floats (half the
bytes); integer and bool tensors pass through unchanged. kolo sums 16-bit
floats in float32 and rounds each partial sum once, so fp16 compression
loses less than a sum carried out in float16.
"""

from __future__ import annotations

from typing import Any, Tuple

import torch


class Compressor:
    """The interface: ``compress(tensor) -> (tensor, ctx)`` and
    ``decompress(tensor, ctx) -> tensor``, both static and pure (the input
    is not modified)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        """Returns the tensor to send and the context ``decompress`` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Returns the tensor in the form ``compress`` was given."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression (the default): the tensor travels as it is."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class _CastCompressor(Compressor):
    """Floating-point tensors travel as ``wire`` and come back in their own
    dtype; other tensors travel unchanged. The context is the original
    dtype."""

    wire: torch.dtype

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire:
            return tensor.to(cls.wire), tensor.dtype
        return tensor, tensor.dtype

    @classmethod
    def decompress(cls, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
            return tensor.to(ctx)
        return tensor


class FP16Compressor(_CastCompressor):
    """Floating-point tensors travel as float16 (Horovod's ``fp16``). Values
    beyond ±65504 become infinite: scale gradients (AMP) if they can be."""

    wire = torch.float16


class BF16Compressor(_CastCompressor):
    """Floating-point tensors travel as bfloat16: float32's range with 8
    bits of mantissa, so no overflow where float16 would overflow."""

    wire = torch.bfloat16


class Compression:
    """The compressors, as ``compression=`` arguments take them."""

    none = NoneCompressor
    """No compression (the default)."""

    fp16 = FP16Compressor
    """Floating-point tensors travel as float16."""

    bf16 = BF16Compressor
    """Floating-point tensors travel as bfloat16 (kolo's addition)."""


__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]
