"""Horovod's ``Compression`` for every binding: one spec, cast through a
framework adapter.

A compressor turns a tensor into the tensor that travels and a context, and
back: ``compressed, ctx = C.compress(t)`` before the collective,
``C.decompress(result, ctx)`` after it. ``fp16`` and ``bf16`` send
floating-point tensors as 16-bit floats (half the bytes); integer and bool
tensors pass through unchanged. kolo sums 16-bit floats in float32 and
rounds each partial sum once, so fp16 compression loses less than a sum
carried out in float16.

A binding calls :func:`make` with an :class:`Adapter` (how its tensors tell
their dtype and cast) and exports the returned ``Compression`` namespace.
"""

from __future__ import annotations

from typing import Any, Tuple


class Adapter:
    """What compression needs of a framework: a tensor's dtype, whether a
    dtype is floating-point, a 16-bit wire dtype by kolo name ("float16",
    "bfloat16"), and a cast."""

    @staticmethod
    def dtype(tensor: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def is_floating(dtype: Any) -> bool:
        raise NotImplementedError

    @staticmethod
    def wire(name: str) -> Any:
        raise NotImplementedError

    @staticmethod
    def cast(tensor: Any, dtype: Any) -> Any:
        raise NotImplementedError


class Compressor:
    """The interface: ``compress(tensor) -> (tensor, ctx)`` and
    ``decompress(tensor, ctx) -> tensor``, both static and pure (the input
    is not modified)."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        """Returns the tensor to send and the context ``decompress`` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Returns the tensor in the form ``compress`` was given."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression (the default): the tensor travels as it is."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class CastCompressor(Compressor):
    """Floating-point tensors travel as ``wire_name`` and come back in their
    own dtype; other tensors travel unchanged. The context is the original
    dtype. Subclasses set ``adapter`` and ``wire_name``."""

    adapter: type = Adapter
    wire_name: str = ""

    @classmethod
    def compress(cls, tensor: Any) -> Tuple[Any, Any]:
        a = cls.adapter
        dt, wire = a.dtype(tensor), a.wire(cls.wire_name)
        if a.is_floating(dt) and dt != wire:
            return a.cast(tensor, wire), dt
        return tensor, dt

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:
        a = cls.adapter
        if ctx is not None and a.is_floating(ctx) and a.dtype(tensor) != ctx:
            return a.cast(tensor, ctx)
        return tensor


def make(adapter: type) -> tuple:
    """(Compression, FP16Compressor, BF16Compressor) for ``adapter``."""

    class FP16Compressor(CastCompressor):
        """Floating-point tensors travel as float16 (Horovod's ``fp16``).
        Values beyond ±65504 become infinite: scale gradients (loss scaling)
        if they can be."""

        wire_name = "float16"

    class BF16Compressor(CastCompressor):
        """Floating-point tensors travel as bfloat16: float32's range with 8
        bits of mantissa, so no overflow where float16 would overflow."""

        wire_name = "bfloat16"

    FP16Compressor.adapter = BF16Compressor.adapter = adapter

    class Compression:
        """The compressors, as ``compression=`` arguments take them."""

        none = NoneCompressor
        """No compression (the default)."""

        fp16 = FP16Compressor
        """Floating-point tensors travel as float16."""

        bf16 = BF16Compressor
        """Floating-point tensors travel as bfloat16 (kolo's addition)."""

    return Compression, FP16Compressor, BF16Compressor
