"""From the user's arrays and tensors to flat transport arrays, and back.

- :func:`flatten`: a 1-D *transport* view of a NumPy array or torch tensor, with no copy;
  half precision travels as ``int16`` (MPI has no 16-bit float type) and is reduced
  through views in its real dtype; :func:`flatten_bytes`: a byte view of any dtype, for
  the collectives that only move data (allgather, alltoall);
- :func:`on_device`: whether a call on CUDA memory hands MPI the device buffers (a
  CUDA-aware MPI, from ``$HPCTRAIN_CUDA_DIRECT_BYTES`` up) or stages them;
- :func:`pinned`, :func:`stage` and :func:`run_staged`: CUDA data moved through a reused
  page-locked host buffer when MPI is not CUDA-aware or the message is small;
  :func:`execute`: a collective's data phase where its data is (host, device, or staged);
- :func:`fused_buffer`, :func:`copy_in`, :func:`copy_out`: many tensors packed into one
  reused flat buffer for :func:`~hpctrain.collectives.allreduce_fused`.
"""

import sys

import numpy as np

from ..errors import UsageError
from .algorithm import count_option
from .dtypes import DTYPES, NUMPY_DTYPES, bad_dtype

#: The environment variable that sets the smallest CUDA message, in bytes, handed to a
#: CUDA-aware MPI as device memory; smaller ones are staged through pinned host memory.
DIRECT_ENV = "HPCTRAIN_CUDA_DIRECT_BYTES"
#: Its default, 1 MiB, from `bench allreduce|allgather --device cuda` at np 2 on an H100 over a
#: CUDA-aware Open MPI 4.1 (smcuda, CUDA IPC; docs/gpu.md): every device message cost it
#: 420-1000 us whatever its size, so that up to 512 KiB the staged path was 1.3-9 times faster
#: and from 2 MiB the direct one was as fast or faster.
DIRECT_BYTES = 1 << 20


class Seen:
    """What :func:`flatten` has met: ``tensor`` is ``torch.Tensor`` once a tensor went
    through it (torch is imported by then), so that the driver compares types with it
    without importing torch; ``None`` before, which no ``type(buf)`` is."""

    def __init__(self):
        self.tensor = None


#: What the driver compares a buffer's type with.
SEEN = Seen()


def flatten(buf, what="allreduce", writes=True):
    """``(flat, dtype, device)``: a 1-D transport view of ``buf`` (no copy), its
    :class:`~.dtypes.DType`, and ``None`` for host memory or the CUDA device index.
    ``what``: the collective, for the error messages; ``writes``: it writes into ``buf``."""
    if isinstance(buf, np.ndarray):
        dtype = NUMPY_DTYPES.get(buf.dtype)
        if dtype is None:
            raise bad_dtype(buf.dtype.str if buf.dtype.byteorder == ">" else buf.dtype.name,
                            what)
        flat = _flat_array(buf, what, writes)
        return (flat.view(np.int16) if dtype.half else flat), dtype, None
    torch = _torch_of(buf, what)
    dtype = DTYPES.get(str(buf.dtype).replace("torch.", ""))
    if dtype is None:
        raise bad_dtype(str(buf.dtype), what)
    flat = _flat_tensor(buf, what)
    flat, device = _placed(flat.view(torch.int16) if dtype.half else flat, what)
    return flat, dtype, device


def flatten_bytes(buf, what, writes):
    """``(flat, dtype_name, device)``: a 1-D ``uint8`` view of ``buf``'s bytes (no copy),
    whatever its dtype (bool, complex, bfloat16, ...), the dtype's name, and ``None`` for
    host memory or the CUDA device index. For the collectives that move bytes only."""
    if isinstance(buf, np.ndarray):
        if buf.dtype.hasobject:
            raise UsageError(f"{what} moves bytes, but an array of dtype {buf.dtype} holds "
                             f"Python object references: pass an array of numbers")
        return _flat_array(buf, what, writes).view(np.uint8), buf.dtype.str \
            if buf.dtype.byteorder == ">" else buf.dtype.name, None
    torch = _torch_of(buf, what)
    flat, device = _placed(_flat_tensor(buf, what).view(torch.uint8), what)
    return flat, str(buf.dtype).replace("torch.", ""), device


def _flat_array(buf, what, writes):
    if not buf.flags.c_contiguous:
        raise UsageError(f"{what} needs a contiguous buffer, got a non-contiguous "
                         f"array of shape {buf.shape} and strides {buf.strides}: pass "
                         f"np.ascontiguousarray(buf) and use the array it returns (the "
                         f"result is written in place)")
    if writes and not buf.flags.writeable:
        raise UsageError(f"{what} writes into the array (allreduce: in place), but it is "
                         f"read-only")
    return buf.reshape(-1)


def _torch_of(buf, what):
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(buf, torch.Tensor):
        raise UsageError(f"{what} needs a NumPy array or a torch tensor, got "
                         f"{type(buf).__name__}")
    SEEN.tensor = torch.Tensor
    return torch


def _flat_tensor(buf, what):
    if not buf.is_contiguous():
        raise UsageError(f"{what} needs a contiguous tensor, got one of shape "
                         f"{tuple(buf.shape)} and strides {buf.stride()}: pass "
                         f"buf.contiguous() and use the tensor it returns (the result is "
                         f"written in place)")
    flat = buf.detach().view(-1)
    # A contiguous tensor of 0 or 1 element may have any stride, which a view as another
    # element size refuses: the same memory, with stride 1.
    return flat if flat.numel() > 1 else flat.as_strided((flat.numel(),), (1,))


def _placed(flat, what):
    """``(flat, device)`` of a flat tensor: a NumPy view on the CPU, the index on CUDA."""
    if flat.device.type == "cuda":
        return flat, flat.device.index
    if flat.device.type != "cpu":
        raise UsageError(f"{what} supports CPU and CUDA tensors, got one on {flat.device}")
    return flat.numpy(), None


def direct_bytes():
    """The smallest CUDA message handed to MPI as device memory: ``$HPCTRAIN_CUDA_DIRECT_BYTES``,
    else :data:`DIRECT_BYTES`."""
    return count_option("cuda_direct_bytes", None, DIRECT_ENV, DIRECT_BYTES,
                        "a whole number of bytes, e.g. 65536 (0: device memory at every size)")


def on_device(ctx, algorithm, dtype, nbytes):
    """True when a call of ``nbytes`` on CUDA memory gives ``algorithm`` the device memory
    itself; False when it is staged through pinned host memory: MPI is not CUDA-aware (or
    the algorithm cannot take ``dtype`` there), or the message is under
    :func:`direct_bytes`, where a CUDA-aware MPI's device path costs more per message than
    two copies (docs/gpu.md). An algorithm that moves device memory by its own means
    (Horovod) always gets it."""
    if not algorithm.device_capable(dtype, ctx.cuda_aware):
        return False
    return algorithm.moves_device_memory or nbytes >= ctx.direct_bytes


def pinned(ctx, dtype, count):
    """A reused page-locked host buffer of ``count`` transport elements (torch tensor),
    through which CUDA data is staged when MPI is not CUDA-aware."""
    import torch

    def make(n):
        return torch.empty(n, dtype=getattr(torch, dtype.transport), pin_memory=True)
    return ctx.workspace(("pinned", dtype.transport), count, make)[:count]


def run_staged(ctx, plan, flat):
    """The data phase of ``plan`` on CUDA memory ``flat``, through a pinned host copy."""
    stage(ctx, plan.dtype, (flat,), (flat,), plan.algorithm.bind(ctx.comm, plan))


def stage(ctx, dtype, inputs, outputs, run):
    """``run(*host views)`` for the flat CUDA transport arrays ``inputs + outputs``, through
    one reused pinned host buffer (:func:`pinned`): the inputs are copied to the host before,
    the outputs back to the device after. An array that is both (allreduce's buffer) is
    passed once, as an input."""
    arrays = list(inputs) + [a for a in outputs if not any(a is b for b in inputs)]
    host = pinned(ctx, dtype, sum(len(a) for a in arrays))
    views = segments(host, [len(a) for a in arrays])
    for view, array in zip(views, inputs):
        view.copy_(array)     # device -> page-locked host; blocks until the copy is done
    run(*(view.numpy() for view in views))
    for view, array in zip(views, arrays):
        if any(array is out for out in outputs):
            array.copy_(view)


def execute(ctx, algorithm, dtype, device, inputs, outputs, bind):
    """Run ``bind(on_device)(*inputs, *outputs)`` where the data is: on the host, on the
    device (a CUDA-aware MPI and an algorithm that can), or through the pinned host buffer."""
    if device is None:
        bind(False)(*inputs, *outputs)
    elif on_device(ctx, algorithm, dtype,
                   max(a.numel() * a.element_size() for a in (*inputs, *outputs))):
        # MPI reads device memory directly: kernels that wrote it must be done.
        sys.modules["torch"].cuda.current_stream(device).synchronize()
        bind(True)(*inputs, *outputs)
    else:
        stage(ctx, dtype, inputs, outputs, bind(False))


def fused_buffer(ctx, tensors):
    """The reused flat buffer for ``tensors`` (a view of its first elements), and their sizes.

    Kept per (communicator, dtype, device) and only grown, so a training loop that fuses
    the same gradients each step allocates once.
    """
    if not tensors:
        return np.empty(0, dtype=np.float32), ()
    kinds = sorted({f"{type(t).__module__}.{type(t).__name__} {t.dtype} "
                    f"{getattr(t, 'device', 'cpu')}" for t in tensors})
    if len(kinds) > 1:
        raise UsageError(f"allreduce_fused needs tensors of one dtype, all NumPy or all torch "
                         f"on one device; got: {'; '.join(kinds)}")
    first = tensors[0]
    sizes = tuple(int(np.prod(t.shape)) for t in tensors)
    total = sum(sizes)
    if isinstance(first, np.ndarray):
        kind = ("fused", first.dtype.str)

        def make(n):
            return np.empty(n, dtype=first.dtype)
    else:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(first, torch.Tensor):
            raise UsageError(f"allreduce_fused needs NumPy arrays or torch tensors, got "
                             f"{type(first).__name__}")
        kind = ("fused", str(first.dtype), str(first.device))

        def make(n):
            return torch.empty(n, dtype=first.dtype, device=first.device)
    buffer = ctx.fused.get(kind)
    if buffer is None or buffer.shape[0] < total:
        buffer = ctx.fused[kind] = make(total)
    return buffer[:total], sizes


def segments(buffer, sizes):
    """Consecutive views of ``buffer``, one of each of ``sizes`` elements."""
    views, offset = [], 0
    for size in sizes:
        views.append(buffer[offset:offset + size])
        offset += size
    return views


def copy_in(segment, tensor):
    """Copy ``tensor`` into its flat ``segment`` of the fused buffer."""
    if isinstance(segment, np.ndarray):
        np.copyto(segment.reshape(tensor.shape), tensor)
    else:
        segment.view(tensor.shape).copy_(tensor.detach())


def copy_out(tensor, segment):
    """Copy the reduced ``segment`` back into ``tensor``."""
    if isinstance(segment, np.ndarray):
        np.copyto(tensor, segment.reshape(tensor.shape))
    else:
        tensor.detach().copy_(segment.view(tensor.shape))
