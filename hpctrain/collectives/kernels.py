"""Reduction kernels: ``dst op= src`` on transport arrays, and the average's division."""

import numpy as np

_UFUNCS = {"sum": np.add, "min": np.minimum, "max": np.maximum, "prod": np.multiply}


def host_reducer(dtype, op, count):
    """``reduce(dst, src)``: ``dst op= src`` on host transport arrays, in place.

    float16 and bfloat16 are reduced with torch in their own precision: every pairwise
    reduction is rounded once to the dtype (exactly what computing it in float32 and
    rounding back gives). NumPy's float16 arithmetic is ~30x slower than torch's and NumPy
    has no bfloat16.
    """
    if dtype.half:
        return _torch_reducer(dtype.torch, op, synchronize=None)
    ufunc = _UFUNCS[op]
    if count <= 2 and op == "sum" and not dtype.integer:
        # A ufunc call costs ~0.5 us (~1 us for one element) when the whole message takes
        # ~1 us; Python float adds are 3x cheaper and round the same (float64 exactly;
        # float32 once, from a float64 sum that is exact). Integers keep the ufunc, which
        # wraps on overflow where Python ints would not fit back.
        return add_few
    return lambda dst, src: ufunc(dst, src, out=dst)


def add_few(dst, src):
    """``dst += src`` for float arrays of at most 2 elements, with Python floats."""
    count = len(dst)
    if count:
        dst[0] = dst.item(0) + src.item(0)
        if count == 2:
            dst[1] = dst.item(1) + src.item(1)


def device_reducer(dtype, op, device):
    """``reduce(dst, src)`` on CUDA transport tensors; waits for the kernel before returning,
    because MPI reads the result straight from device memory in the next message."""
    import torch

    return _torch_reducer(dtype.torch, op,
                          synchronize=lambda: torch.cuda.current_stream(device).synchronize())


def _torch_reducer(torch_dtype, op, synchronize):
    import torch

    as_tensor = torch.from_numpy if synchronize is None else (lambda t: t)
    apply = {"sum": lambda d, s: d.add_(s), "min": lambda d, s: torch.minimum(d, s, out=d),
             "max": lambda d, s: torch.maximum(d, s, out=d), "prod": lambda d, s: d.mul_(s)}[op]

    def reduce(dst, src):
        apply(as_tensor(dst).view(torch_dtype), as_tensor(src).view(torch_dtype))
        if synchronize is not None:
            synchronize()
    return reduce


def averager(dtype, size, on_device):
    """``finish(flat)``: divide the sum by ``size`` in place; floor division for integers
    (``-3 // 2 == -2``, as Python and ``np.floor_divide`` round).

    On the device it waits for the kernel before returning, as :func:`device_reducer` does:
    the ring divides its own chunk between its two phases and MPI then sends that chunk
    straight from device memory (without the wait, seen on an H100: the other ranks got
    the undivided sum)."""
    if on_device or dtype.half:
        torch_dtype = dtype.torch
        import torch

        as_tensor = (lambda t: t) if on_device else torch.from_numpy
        mode = "floor" if dtype.integer else None

        def finish(flat):
            quotient = as_tensor(flat).view(torch_dtype).div_(size, rounding_mode=mode)
            if on_device:
                torch.cuda.current_stream(quotient.device).synchronize()
        return finish
    if dtype.integer:
        return lambda flat: np.floor_divide(flat, size, out=flat)
    return lambda flat: np.divide(flat, size, out=flat)
