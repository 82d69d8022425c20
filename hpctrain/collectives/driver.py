"""The driver: :func:`allreduce` and :func:`allreduce_fused`, the same for every algorithm.

A call finds the communicator's :class:`~.contexts.Context`, turns the buffer into a flat
transport array (:mod:`.buffers`), finds or builds the plan of this (algo, op, dtype,
count, options), runs the mismatch check when asked and then the plan's data phase. The
per-call cost matters for small messages (a message takes a few microseconds), so the
common cases are tried first: the same buffer as the last call, then an array or tensor
whose plan exists.
"""

import numpy as np

from . import auto, contexts
from .buffers import SEEN, copy_in, copy_out, flatten, fused_buffer, segments
from .check import empty_vector, with_layout
from .contexts import context
from .plans import LastCall
from ..errors import UsageError

#: Tensors whose NumPy views are kept for the next call: at most this many, this small.
VIEW_TENSORS, VIEW_BYTES = 16, 256 * 1024


def allreduce(buf, op="sum", algo="ring", comm=None, check=True, **options):
    """Reduce ``buf`` over every rank of ``comm`` in place and return it.

    ``buf``: a contiguous NumPy array or torch tensor of any shape (its flattened elements
    are reduced), dtype float16, bfloat16 (torch only), float32, float64, int32 or int64, in
    host memory or on a CUDA device. ``op``: ``sum``, ``avg``, ``min``, ``max`` or ``prod``;
    ``avg`` is the sum divided by the number of ranks, with floor division for integer
    dtypes.
    ``algo``: a name in ``ALGORITHMS``, or ``auto`` (chosen per size from the profile given
    to :func:`hpctrain.collectives.auto.use`); ``options``: that algorithm's options (``root=``,
    ``servers=``, ``switch_bytes=``, ``ranks_per_node=``). ``comm``: an mpi4py
    intracommunicator, default ``COMM_WORLD``; the data moves on a private duplicate of it,
    so pending user messages are never matched.

    Half precision (float16, bfloat16) is reduced in its own precision: each pairwise
    reduction is computed by torch and rounded once to the dtype, as computing it in float32
    and rounding back would; the error can grow with every one of the ``p - 1`` additions
    that make up each element's sum.

    Synchronisation point: a collective. Every rank of ``comm`` must call it, in the same
    order as its other collectives on ``comm``, with the same element count, dtype, op,
    algo, options and ``check``. With ``check=True`` (the default) a call that breaks this is
    detected before any data moves, by one extra small allreduce (about ``ceil(lg p)``
    latencies), and raises :class:`MismatchError` on every rank; an argument that is wrong
    on only some ranks raises its own ``UsageError`` there and a ``MismatchError`` on the
    others (``comm`` excepted: it must be valid everywhere). With ``check=False`` that
    allreduce is saved, and a mismatched call may hang or return garbage. An error in the
    data phase itself (an MPI failure) is not coordinated: run under
    :func:`hpctrain.runtime.run_guarded` so that it ends the job.

    CUDA tensors: a CUDA-aware MPI gets device memory straight after the current stream
    has been synchronised, and the reductions run on the device with torch; otherwise the
    data is staged through a reused page-locked host buffer.
    """
    if algo == "auto":
        algo = auto.ACTIVE.name     # "auto#<generation of the profile in use>"
    if comm is None:
        ctx = contexts.AT_HAND.world or context()
    else:
        known = contexts.AT_HAND.last
        ctx = known[1] if comm is known[0] else context(comm)
    # The same buffer as the last call, reduced the same way: its plan and its bound data
    # phase are at hand once the buffer is checked to still be the memory, dtype and layout
    # it was.
    last = ctx.last_call
    if buf is last.buf and algo == last.algo and op == last.op and not options and (
            (last.data_ptr() == last.ptr and buf.dtype is last.dtype and last.is_contiguous()
             and last.numel() == last.plan.count) if last.ptr is not None else
            (buf.dtype is last.dtype and buf.flags.c_contiguous and buf.flags.writeable)):
        if check and ctx.size > 1:
            ctx.verify(last.plan.check, last.plan)
        last.go()
        return buf
    try:
        flat, plan = _known(ctx, buf, op, algo) if not options else (None, None)
        if plan is None:
            flat, plan = resolve(ctx, buf, op, algo, options)
    except UsageError:
        if check and ctx.size > 1:
            ctx.announce_invalid()
        raise
    if check and ctx.size > 1:
        ctx.verify(plan.check, plan)
    plan.run(flat)
    if type(flat) is np.ndarray and not options and algo[:5] != "auto#":
        # A host buffer (a CUDA tensor's run synchronises its stream: not worth it there).
        ctx.last_call = LastCall(buf, algo, op, plan, ctx.bind_buffer(plan, flat),
                                 tensor=type(buf) is not np.ndarray)
    return buf


def _known(ctx, buf, op, algo):
    """``(flat, plan)`` for an array or tensor whose plan exists (its dtype was checked
    when the plan was made), else ``(None, None)``."""
    if type(buf) is np.ndarray:
        flags = buf.flags
        if flags.c_contiguous and flags.writeable:
            return (buf if buf.ndim == 1 else buf.reshape(-1)), \
                ctx.quick.get((algo, op, buf.dtype, buf.size))
    elif type(buf) is SEEN.tensor:
        # Tensor.numpy() costs ~1.5 us: reuse the view made last time, if the tensor
        # still has the same memory, dtype, size and layout.
        view = ctx.last_view
        if view[0] is not buf:
            view = ctx.views.get(id(buf))
        if view is not None and view[0] is buf and buf.data_ptr() == view[1] \
                and buf.dtype is view[2] and buf.numel() == view[3] and buf.is_contiguous():
            ctx.last_view = view
            return view[4], ctx.quick.get((algo, op, view[2], view[3]))
    return None, None


def resolve(ctx, buf, op, algo, options):
    """``(flat, plan)`` for a call: the transport view of ``buf`` and its (cached) plan."""
    flat, dtype, device = flatten(buf)
    count = len(flat)
    key = (algo, op, dtype.code, count, device, options_key(options) if options else ())
    chosen = algo
    if algo[:5] == "auto#":
        # The profile's choice for this size, cached under the profile's own name
        # (auto.ACTIVE.name), so that a new profile takes effect at the next call.
        chosen = auto.choice(count * dtype.itemsize, ctx.size)[0]
    plan = ctx.plans.get(key) or ctx.plan(key, chosen, op, dtype, count, options, device)
    if options or device is not None:
        return flat, plan
    if type(buf) is np.ndarray and not dtype.half:
        ctx.quick[(algo, op, buf.dtype, count)] = plan
    elif type(buf) is SEEN.tensor:
        ctx.quick[(algo, op, buf.dtype, count)] = plan
        if count * dtype.itemsize <= VIEW_BYTES:
            # The cache holds the tensor (the view needs its memory): small ones only.
            if len(ctx.views) >= VIEW_TENSORS:
                ctx.views.clear()
                ctx.last_view = contexts.NO_VIEW
            ctx.views[id(buf)] = (buf, buf.data_ptr(), buf.dtype, count, flat)
    return flat, plan


def options_key(options):
    """The options as a hashable cache key; a ``UsageError`` for an unhashable value."""
    key = tuple(options.items())
    try:
        hash(key)
    except TypeError:
        raise UsageError(f"allreduce options must be integers, got {options}") from None
    return key


def allreduce_fused(tensors, op="avg", algo="ring", comm=None, check=True, **options):
    """Reduce every array or tensor of ``tensors`` in place with one allreduce; return the list.

    The inputs (same dtype, all NumPy or all torch on one device, any shapes and strides)
    are copied into one flat buffer, reduced in one call of :func:`allreduce` and copied
    back. The buffer is kept per (communicator, dtype, device) and only grown, so a training
    loop that fuses the same gradients each step allocates once.

    Synchronisation point, as :func:`allreduce`; every rank must pass tensors of the same
    sizes in the same order (sort named parameters first). With ``check=True`` the sizes
    are part of the mismatch check.
    """
    tensors = list(tensors)
    if algo == "auto":
        algo = auto.ACTIVE.name
    ctx = context(comm)
    try:
        buffer, sizes = fused_buffer(ctx, tensors)
        flat, plan = resolve(ctx, buffer, op, algo, options) if tensors else (None, None)
    except UsageError:
        if check and ctx.size > 1:
            ctx.announce_invalid()
        raise
    if check and ctx.size > 1:
        ctx.verify(with_layout(empty_vector() if plan is None else plan.check, sizes), plan)
    if plan is None:
        return tensors
    views = segments(buffer, sizes)
    for tensor, segment in zip(tensors, views):
        copy_in(segment, tensor)
    plan.run(flat)
    for tensor, segment in zip(tensors, views):
        copy_out(tensor, segment)
    return tensors
