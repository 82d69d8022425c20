"""Allreduce, broadcast and barrier on torch tensors, with Horovod's names and semantics.

Every function is a collective over the communicator given to ``init``: all ranks call it,
in the same order (see :mod:`hpctrain.torch.basics`). ``*_async`` functions queue the
operation and return a handle at once; ``synchronize(handle)`` waits and returns the
result, ``poll(handle)`` says whether it is done. Functions ending in ``_`` work in place.

Before any data moves, every call checks in one small allreduce that all ranks passed the
same name, shape, dtype, op and root: a difference raises :class:`HorovodInternalError` on
every rank (Horovod raises too) instead of a hang or mixed data. A bad argument found on one
rank only (not a tensor, an unsupported device) is raised there, and the other ranks learn
of it in the same check.

Semantics follow Horovod 0.28: ``op`` defaults to ``Average``; ``average=`` is the old
spelling (not both); the average of an integer tensor is its sum divided by the number of
ranks, truncated towards zero; ``prescale_factor`` and ``postscale_factor`` multiply before
and after the reduction. Not supported (a ``NotImplementedError`` says what to use):
``Adasum``, ``Product``, process sets, ``alltoall``, ``reducescatter``, sparse tensors.
"""

import zlib

import numpy as np
import torch

from .basics import world

# Horovod's numbering of the reduction operations.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAMES = {Average: "avg", Sum: "sum", Min: "min", Max: "max"}

# dtypes the collectives reduce as they are; the small integer types travel widened.
_DIRECT = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
           torch.int64}
_WIDENED = {torch.uint8: torch.int32, torch.int8: torch.int32, torch.int16: torch.int32,
            torch.bool: torch.int32}
_DTYPE_CODES = {dtype: i for i, dtype in enumerate(sorted(
    _DIRECT | set(_WIDENED) | {torch.complex64, torch.complex128}, key=str))}


class HorovodInternalError(RuntimeError):
    """Ranks made the same collective with different arguments; raised on every rank."""


def unsupported(what, instead):
    """A ``NotImplementedError`` for a Horovod feature hpctrain does not offer."""
    return NotImplementedError(f"hpctrain.torch does not support {what}; {instead}")


# ----- arguments ----------------------------------------------------------------------------

def resolve_op(average, op):
    """The reduction op from Horovod's ``average``/``op`` pair (``Average`` by default)."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise unsupported("op=Adasum", "use op=Average (with any allreduce algorithm)")
    if op == Product:
        raise unsupported("op=Product", "use Sum, Average, Min or Max")
    if op not in _OP_NAMES:
        raise ValueError(f"unknown reduction op {op!r}: use hvd.Average, hvd.Sum, hvd.Min or "
                         f"hvd.Max")
    return op


def check_tensor(tensor, function):
    """``TypeError``/``ValueError`` unless ``tensor`` is a dense CPU or CUDA torch tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"hpctrain.torch.{function} takes a torch.Tensor, got "
                        f"{type(tensor).__name__}")
    if tensor.is_sparse:
        raise unsupported("sparse tensors", "pass tensor.to_dense()")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"hpctrain.torch.{function}: tensors on {tensor.device.type!r} are "
                         f"not supported; move it to the CPU or a CUDA device")
    if tensor.dtype not in _DTYPE_CODES or tensor.dtype.is_complex:
        raise TypeError(f"hpctrain.torch.{function}: dtype {tensor.dtype} is not supported; "
                        f"use a float, integer or bool tensor")


def _check_process_set(process_set):
    if process_set is not None:
        raise unsupported("process sets", "run on a communicator made with Comm.Split and "
                          "pass it to init(comm=...)")


def signature(kind, name, tensors, *extra):
    """The integers every rank must agree on for one call (see :func:`agree`)."""
    fields = [zlib.crc32(kind.encode()), zlib.crc32((name or "").encode()), len(tensors)]
    shapes = ";".join(",".join(map(str, t.shape)) for t in tensors)
    fields.append(zlib.crc32(shapes.encode()))
    fields.append(zlib.crc32(",".join(str(_DTYPE_CODES[t.dtype]) for t in tensors).encode()))
    fields.extend(int(x) for x in extra)
    return np.array([1] + fields, dtype=np.int64)   # field 0: 1 = valid, 0 = invalid


INVALID = np.zeros(1, dtype=np.int64)
SIGNATURE_WIDTH = 12


def agree(w, mine, describe):
    """Collective on the communication thread: raise on every rank unless all ``mine`` agree.

    One ``Allreduce(MIN)`` of ``[mine, -mine]`` gives every rank the minimum and maximum of
    every field; only on a difference, an ``allgather`` of ``describe`` lets the message
    say what each rank passed. A rank whose own arguments were bad sends ``INVALID``.
    """
    from mpi4py import MPI

    width = SIGNATURE_WIDTH     # the same length on every rank, whatever was passed
    vector = np.zeros(2 * width, dtype=np.int64)
    vector[:len(mine)] = mine
    vector[width:width + len(mine)] = -mine
    vector[len(mine):width] = -1     # a shorter signature differs from a longer one
    vector[width + len(mine):] = 1
    if w.size == 1:
        return
    w.comm.Allreduce(MPI.IN_PLACE, vector, op=MPI.MIN)
    if np.array_equal(vector[:width], -vector[width:]):
        return
    said = w.comm.allgather(describe)
    raise HorovodInternalError("ranks made the same collective with different arguments "
                               "(every rank must pass the same name, shape, dtype, op and "
                               "root, in the same order): " +
                               "; ".join(f"rank {r}: {d}" for r, d in enumerate(said)))


def describe_call(kind, name, tensors, **extra):
    """What a call passed, for the mismatch message."""
    what = ", ".join(f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}" for t in tensors)
    more = "".join(f" {k}={v}" for k, v in extra.items())
    return f"{kind}(name={name!r}: {what}{more})"


def fail_together(w, error):
    """Tell the other ranks this call is invalid (they raise too), then raise ``error``."""
    if w.hvd is None:
        handle = w.engine.submit(lambda: agree(w, INVALID, f"invalid call: {error}"))
        try:
            handle.wait()
        except HorovodInternalError:
            pass    # the others' error; this rank raises its own
    raise error


# ----- CUDA stream ordering -----------------------------------------------------------------

def caller_event(tensors):
    """A CUDA event after the caller's pending work on ``tensors`` (``None`` on the CPU)."""
    for t in tensors:
        if t.is_cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(t.device))
            return event
    return None


def wait_event(event, tensors):
    """Make this thread's current stream wait for ``event`` (recorded by another thread)."""
    if event is not None:
        torch.cuda.current_stream(tensors[0].device).wait_event(event)


# ----- the reductions (run on the communication thread) -------------------------------------

def reduce_flat(w, flat, op, prescale=1.0, postscale=1.0):
    """Reduce the contiguous 1-D ``flat`` in place with ``w``'s algorithm (no check)."""
    from .. import collectives

    if prescale != 1.0:
        flat.mul_(prescale)
    if w.size == 1:
        # Every op of one rank is the identity: no call, no averaging pass over the data.
        if postscale != 1.0:
            flat.mul_(postscale)
        return flat
    integer = not (flat.dtype.is_floating_point or flat.dtype.is_complex)
    name = _OP_NAMES[op]
    wide = _WIDENED.get(flat.dtype)
    work = flat.to(wide) if wide is not None else flat
    if op == Average and (integer or w.algo == "horovod"):
        # Horovod truncates an integer average towards zero; the collectives' "avg" floors.
        collectives.allreduce(work, op="sum", algo=w.algo, comm=w.comm, check=False)
        if integer:
            work.copy_(torch.div(work, w.size, rounding_mode="trunc"))
        else:
            work.div_(w.size)
    else:
        collectives.allreduce(work, op=name, algo=w.algo, comm=w.comm, check=False)
    if work is not flat:
        flat.copy_(work)
    if postscale != 1.0:
        flat.mul_(postscale)
    return flat


def _reduce_tensors(w, tensors, op, prescale, postscale, compression):
    """Reduce every tensor of ``tensors`` in place, one flat buffer per dtype and device."""
    from .buckets import FlatBuffer

    groups = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for group in groups.values():
        if len(group) == 1 and group[0].is_contiguous() and compression is _NONE:
            reduce_flat(w, group[0].view(-1), op, prescale, postscale)
            continue
        packed = FlatBuffer(group)
        packed.pack(group)
        wire, ctx = compression.compress(packed.flat)
        reduce_flat(w, wire, op, prescale, postscale)
        if wire is not packed.flat:
            packed.flat.copy_(compression.decompress(wire, ctx))
        packed.unpack(group)


def _none_compression():
    from .compression import Compression

    return Compression.none


_NONE = _none_compression()


def _submit(w, kind, name, tensors, run, extra=(), described=None):
    """Queue ``run()`` after the agreement check; register ``name`` as in flight."""
    if name is not None:
        if name in w.pending_names:
            raise ValueError(f"Requested to {kind} a tensor with the same name as another "
                             f"tensor that is currently being processed: {name!r}")
        w.pending_names.add(name)
    mine = signature(kind, name, tensors, *extra)
    describe = described or describe_call(kind, name, tensors)
    event = caller_event(tensors)

    def job():
        agree(w, mine, describe)
        wait_event(event, tensors)
        result = run()
        return result, caller_event(tensors)

    return w.engine.submit(job, name)


def _guarded(kind, function, tensors, check_extra=None):
    """The world, after checking ``tensors`` here; a bad argument fails on every rank."""
    w = world()
    try:
        for t in tensors:
            check_tensor(t, function)
        if check_extra is not None:
            check_extra()
    except (TypeError, ValueError, NotImplementedError) as error:
        fail_together(w, error)
    return w


# ----- allreduce ----------------------------------------------------------------------------

def _allreduce_async(tensor, output, average, name, op, prescale_factor, postscale_factor,
                     process_set, function):
    op_box = []
    w = _guarded("allreduce", function, [tensor],
                 lambda: (_check_process_set(process_set), op_box.append(resolve_op(average,
                                                                                    op))))
    op = op_box[0]
    if w.hvd is not None:
        hvd_function = getattr(w.hvd, function)
        return hvd_function(tensor, name=name, op=op, prescale_factor=prescale_factor,
                            postscale_factor=postscale_factor)

    def run():
        target = output
        if output is not tensor:
            target.copy_(tensor.detach())
        flat = target.view(-1) if target.is_contiguous() else target.contiguous().view(-1)
        reduce_flat(w, flat, op, prescale_factor, postscale_factor)
        if flat.data_ptr() != target.data_ptr():
            target.copy_(flat.view(target.shape))
        return target

    return _submit(w, "allreduce", name, [tensor], run, (op, _scale_code(prescale_factor),
                                                         _scale_code(postscale_factor)),
                   describe_call("allreduce", name, [tensor], op=op))


def _scale_code(factor):
    return zlib.crc32(repr(float(factor)).encode())


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    """Queue an allreduce of ``tensor`` into a new tensor; return a handle."""
    output = torch.empty_like(tensor) if isinstance(tensor, torch.Tensor) else None
    return _allreduce_async(tensor, output, average, name, op, prescale_factor,
                            postscale_factor, process_set, "allreduce_async")


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None):
    """Queue an in-place allreduce of ``tensor``; return a handle."""
    return _allreduce_async(tensor, tensor, average, name, op, prescale_factor,
                            postscale_factor, process_set, "allreduce_async_")


class _Allreduce(torch.autograd.Function):
    """Allreduce with a gradient: the gradient of the result is reduced the same way."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor):
        ctx.args = (average, name, op, prescale_factor, postscale_factor)
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                           postscale_factor))

    @staticmethod
    def backward(ctx, grad):
        average, name, op, prescale, postscale = ctx.args
        reduced = synchronize(allreduce_async(grad.contiguous(), average, None, op, prescale,
                                              postscale))
        return reduced, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=_NONE, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """The reduction of ``tensor`` over all ranks, in a new tensor (differentiable).

    Synchronisation point: a collective; see the module docstring for the semantics.
    """
    w = world()
    if w.hvd is not None:
        return w.hvd.allreduce(tensor, average=average, name=name, compression=compression,
                               op=op, prescale_factor=prescale_factor,
                               postscale_factor=postscale_factor)
    _guarded("allreduce", "allreduce", [tensor])
    wire, ctx = compression.compress(tensor)
    if wire.requires_grad:
        reduced = _Allreduce.apply(wire, average, name, op, prescale_factor, postscale_factor)
    else:
        reduced = synchronize(allreduce_async(wire, average, name, op, prescale_factor,
                                              postscale_factor, process_set))
    return compression.decompress(reduced, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """Reduce ``tensor`` over all ranks in place; return it. A collective."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def _grouped_async(tensors, outputs, average, name, op, prescale_factor, postscale_factor,
                   process_set, function):
    tensors = list(tensors) if isinstance(tensors, (list, tuple)) else tensors
    if not isinstance(tensors, list):
        world()
        raise TypeError(f"hpctrain.torch.{function} takes a list of tensors, got "
                        f"{type(tensors).__name__}")
    op_box = []
    w = _guarded("grouped_allreduce", function, tensors,
                 lambda: (_check_process_set(process_set),
                          op_box.append(resolve_op(average, op))))
    op = op_box[0]
    if w.hvd is not None:
        return getattr(w.hvd, function)(tensors, name=name, op=op,
                                        prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor)
    targets = tensors if outputs is None else outputs

    def run():
        if outputs is not None:
            for out, t in zip(outputs, tensors):
                out.copy_(t.detach())
        _reduce_tensors(w, targets, op, prescale_factor, postscale_factor, _NONE)
        return targets

    return _submit(w, "grouped_allreduce", name, tensors, run,
                   (op, _scale_code(prescale_factor), _scale_code(postscale_factor)),
                   describe_call("grouped_allreduce", name, tensors, op=op))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    """Queue one allreduce of a list of tensors into new tensors; return a handle."""
    outputs = ([torch.empty_like(t) for t in tensors if isinstance(t, torch.Tensor)]
               if isinstance(tensors, (list, tuple)) else None)
    return _grouped_async(tensors, outputs, average, name, op, prescale_factor,
                          postscale_factor, process_set, "grouped_allreduce_async")


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None):
    """Queue one in-place allreduce of a list of tensors; return a handle."""
    return _grouped_async(tensors, None, average, name, op, prescale_factor,
                          postscale_factor, process_set, "grouped_allreduce_async_")


def grouped_allreduce(tensors, average=None, name=None, compression=_NONE, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """The reductions of a list of tensors, in new tensors, fused into one collective."""
    w = world()
    if w.hvd is not None:
        return w.hvd.grouped_allreduce(tensors, average=average, name=name,
                                       compression=compression, op=op,
                                       prescale_factor=prescale_factor,
                                       postscale_factor=postscale_factor)
    pairs = [compression.compress(t) if isinstance(t, torch.Tensor) else (t, None)
             for t in (tensors if isinstance(tensors, (list, tuple)) else [tensors])]
    reduced = synchronize(grouped_allreduce_async(
        [p for p, _ in pairs] if isinstance(tensors, (list, tuple)) else tensors, average,
        name, op, prescale_factor, postscale_factor, process_set))
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None):
    """Reduce a list of tensors in place, fused into one collective; return the list."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# ----- broadcast ----------------------------------------------------------------------------

def _cuda_aware(w):
    if not hasattr(w, "cuda_aware"):
        from ..mpi_support import cuda_awareness

        w.cuda_aware = cuda_awareness(w.user_comm).aware is True
    return w.cuda_aware


def bcast_tensors(w, tensors, root):
    """On the communication thread: ``root``'s values into every tensor of ``tensors``.

    Host tensors go to MPI as byte views (any dtype, no copy when contiguous); CUDA tensors
    too, but only when MPI is CUDA-aware; otherwise through a host copy, which is never
    device memory handed to a library that cannot read it.
    """
    for tensor in tensors:
        work = tensor.detach()
        staged = work.is_cuda and not _cuda_aware(w)
        if staged:
            if work.is_cuda:
                torch.cuda.current_stream(work.device).synchronize()
            work = work.cpu()
        elif not work.is_contiguous():
            work = work.contiguous()
        elif work.is_cuda:
            torch.cuda.current_stream(work.device).synchronize()
        if work.numel():
            view = work.reshape(-1).view(torch.uint8)
            w.comm.Bcast(view if view.is_cuda else view.numpy(), root=root)
        if work.data_ptr() != tensor.data_ptr():
            with torch.no_grad():
                tensor.copy_(work)
    return tensors


def _broadcast_async(tensor, output, root_rank, name, process_set, function):
    w = _guarded("broadcast", function, [tensor], lambda: _check_process_set(process_set))
    if w.hvd is not None:
        return getattr(w.hvd, function)(tensor, root_rank, name=name)

    def run():
        if not 0 <= root_rank < w.size:
            raise ValueError(f"root_rank {root_rank} is not a rank: use 0 to {w.size - 1}")
        if output is not tensor and w.rank == root_rank:
            output.copy_(tensor.detach())
        return bcast_tensors(w, [output], root_rank)[0]

    return _submit(w, "broadcast", name, [tensor], run, (root_rank,),
                   describe_call("broadcast", name, [tensor], root_rank=root_rank))


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Queue a broadcast of ``root_rank``'s ``tensor`` into a new tensor; return a handle."""
    output = torch.empty_like(tensor) if isinstance(tensor, torch.Tensor) else None
    return _broadcast_async(tensor, output, root_rank, name, process_set, "broadcast_async")


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """Queue an in-place broadcast of ``root_rank``'s ``tensor``; return a handle."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set, "broadcast_async_")


def broadcast(tensor, root_rank, name=None, process_set=None):
    """``root_rank``'s ``tensor``, on every rank, in a new tensor. A collective."""
    w = world()
    if w.hvd is not None:
        return w.hvd.broadcast(tensor, root_rank, name=name)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """Overwrite ``tensor`` with ``root_rank``'s on every rank; return it. A collective."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ----- handles and the rest -----------------------------------------------------------------

def synchronize(handle):
    """Wait for the operation of ``handle``; return its result (the output tensor)."""
    w = world()
    if w.hvd is not None and not hasattr(handle, "wait"):
        return w.hvd.synchronize(handle)
    try:
        result, event = handle.wait()
    finally:
        if handle.name is not None:
            w.pending_names.discard(handle.name)
    if event is not None:
        torch.cuda.current_stream().wait_event(event)
    return result


def poll(handle):
    """True when the operation of ``handle`` has finished (``synchronize`` will not block)."""
    w = world()
    if w.hvd is not None and not hasattr(handle, "wait"):
        return w.hvd.poll(handle)
    return handle.done.is_set()


def run_on_thread(w, function, kind, describe=""):
    """Run ``function()`` on the communication thread after the others agree on ``kind``."""
    mine = np.array([1, zlib.crc32(kind.encode())], dtype=np.int64)

    def job():
        agree(w, mine, f"{kind}{describe}")
        return function()

    return w.engine.submit(job).wait()


def barrier(process_set=None):
    """Synchronisation point: return once every rank has called ``barrier``."""
    w = world()
    _check_process_set(process_set)
    if w.hvd is not None:
        return w.hvd.barrier()
    return run_on_thread(w, w.comm.Barrier, "barrier")


def join(device=-1):
    """Not supported: uneven inputs need every rank to run the same number of steps."""
    raise unsupported("join()", "give every rank the same number of batches "
                      "(hpctrain.sampler.DistributedSampler pads to equal counts)")


def alltoall(*args, **kwargs):
    """Not supported."""
    raise unsupported("alltoall", "use mpi4py's Comm.Alltoallv on the same ranks")


def reducescatter(*args, **kwargs):
    """Not supported."""
    raise unsupported("reducescatter", "use allreduce and keep your own slice")


def sparse_allreduce_async(*args, **kwargs):
    """Not supported."""
    raise unsupported("sparse allreduce", "pass dense tensors (tensor.to_dense())")
