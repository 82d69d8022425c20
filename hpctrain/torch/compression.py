"""Gradient compression for the wire, as ``horovod.torch.Compression``.

``Compression.fp16`` and ``Compression.bf16`` halve the bytes of floating-point tensors
(other dtypes pass unchanged); the reduction then runs in that precision, and the result is
cast back to the tensor's dtype.
"""

import torch


class Compressor:
    """No compression: ``compress`` returns the tensor itself."""

    @staticmethod
    def compress(tensor):
        """``(tensor to send, context for decompress)``."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """The tensor in its original dtype."""
        return tensor


class _CastCompressor(Compressor):
    wire = None

    @classmethod
    def compress(cls, tensor):
        """Floating-point tensors cast to the wire dtype; others unchanged."""
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire:
            return tensor.to(cls.wire), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Cast back to the dtype ``compress`` saw."""
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Send floating-point tensors as float16."""

    wire = torch.float16


class BF16Compressor(_CastCompressor):
    """Send floating-point tensors as bfloat16 (float32's range, fewer mantissa bits)."""

    wire = torch.bfloat16


class Compression:
    """The compressors by name: ``none``, ``fp16``, ``bf16``."""

    none = Compressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
