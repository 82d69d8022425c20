"""Adasum (adaptive summation), Horovod's ``op=hvd.Adasum``, over mpi4py on host memory.

    from hpctrain.collectives.adasum import adasum_allreduce
    adasum_allreduce(grad, comm)          # in place, on every rank of comm

Adasum combines two gradients ``a`` and ``b`` as

    adasum(a, b) = (1 - a·b / (2|a|²)) a + (1 - a·b / (2|b|²)) b

which is their sum when they are orthogonal and their common value when they are equal. On
``p = 2^k`` ranks it is applied pairwise up a binary tree: ranks 0 and 1, 2 and 3, ... first,
then the results of (0, 1) and (2, 3), and so on.

The data moves as in Horovod's CPU implementation (``horovod/common/ops/adasum/adasum.h``):
vector halving, distance doubling. At level ``d = 1, 2, 4, ...`` a rank swaps half of the
range it holds with ``rank ^ d`` and keeps the other half, which it now holds twice: a piece
of its own group's vector and the same piece of the partner group's. The dot product and
the squared norms of those two vectors are sums over all their pieces, held by the ``2d``
ranks whose numbers differ only below bit ``2d``: a recursive-doubling sum of three float64
among them, which leaves the same bits on each (each step adds the same two numbers, in
either order). Every rank then combines its pieces. After ``lg p`` levels each rank holds
``1/p`` of the result, and the levels are retraced backwards to give everyone all of it.

Cost: ``2 lg p`` data messages of ``n/2, n/4, ...`` elements (as Rabenseifner's allreduce)
and ``lg p (lg p + 1) / 2`` messages of 24 bytes for the dot products.

As in Horovod: a squared norm below ``sqrt(DBL_MIN)`` counts as zero, and its coefficient
stays 1 (so a zero vector is the identity: the other passes unchanged); dot products and
norms are accumulated in float64 whatever the dtype. Each combination is computed in
float64 and rounded once to the buffer's dtype. float16 travels as its int16 bits (MPI has
no 16-bit float type). Horovod needs a power of two of ranks for Adasum; so does this.
"""

import numpy as np

from .. import tags
from ..errors import UsageError
from .buffers import flatten, stage
from .check import algorithm_code
from .contexts import context
from .dtypes import DTYPES

#: The element types Adasum combines (it needs a dot product: floating point only).
FLOAT_DTYPES = ("float16", "float32", "float64")
#: Message tags on the context's private communicator (:mod:`hpctrain.tags`).
DATA_TAG, DOTS_TAG = tags.ADASUM_DATA, tags.ADASUM_DOTS
#: Horovod's threshold for a zero squared norm.
SQRT_DBL_MIN = float(np.sqrt(np.finfo(np.float64).tiny))


def adasum_allreduce(buf, comm=None):
    """Replace ``buf`` on every rank of ``comm`` (default ``COMM_WORLD``) by the Adasum of
    all ranks' ``buf``; return ``buf``.

    ``buf``: a contiguous, writable NumPy array or torch tensor (CPU or CUDA: Adasum's dot
    products run on the host, so device memory is staged through a pinned host buffer) of
    float16, float32 or float64, of any shape (it is combined as one vector: Adasum's dot
    products are per tensor), with the same size and dtype on every rank. ``comm``: an mpi4py
    intracommunicator whose size is a power of two (a ``UsageError`` on every rank
    otherwise).

    Synchronisation point: a collective over ``comm``; every rank must call it, in the same
    order as its other collectives. The first call on a communicator duplicates it
    (``Dup``, collective). Every call starts with one small ``Allreduce`` that proves the
    ranks passed the same size and dtype: a difference, or a bad buffer on one rank, raises
    on every rank instead of hanging.
    """
    size = _size(comm)
    if size & (size - 1):
        raise UsageError(f"adasum_allreduce needs a power of two of ranks (as Horovod's "
                         f"Adasum does), got {size}: run on 1, 2, 4, 8, ... ranks, or on "
                         f"a sub-communicator of {1 << (size.bit_length() - 1)} of them")
    if size == 1:
        _values(buf)   # one rank: its vector is the result, but a bad buffer still fails
        return buf
    ctx = context(comm)
    try:
        flat, dtype, device = _values(buf)
    except UsageError:
        ctx.announce_invalid()   # the others raise in their check instead of waiting
        raise
    ctx.verify(_call_vector(len(flat), dtype))

    def combine(host):
        _halve_and_double(ctx.comm, host.view(np.float16) if dtype.half else host, ctx.rank,
                          ctx.size)
    if len(flat) and device is None:
        combine(flat)
    elif len(flat):
        stage(ctx, dtype, (flat,), (flat,), combine)
    return buf


def _size(comm):
    from mpi4py import MPI

    if comm is None:
        return MPI.COMM_WORLD.Get_size()
    if not isinstance(comm, MPI.Intracomm):
        raise UsageError(f"adasum_allreduce needs an mpi4py intracommunicator, got "
                         f"{type(comm).__name__}")
    return comm.Get_size()


def _values(buf):
    """``flatten(buf)``: the 1-D transport view whose values Adasum combines (no copy), its
    dtype (floating point, or a ``UsageError``) and its device (``None``: host memory)."""
    flat, dtype, device = flatten(buf, "adasum_allreduce")
    if dtype.name not in FLOAT_DTYPES:
        raise UsageError(f"adasum_allreduce combines floating-point vectors, got dtype "
                         f"{dtype.name}; valid choices: {', '.join(FLOAT_DTYPES)}")
    return flat, dtype, device


def _call_vector(count, dtype):
    """The mismatch check's vector (see :mod:`.check`) for Adasum on ``count`` values of
    ``dtype``."""
    fields = (1, count, DTYPES[dtype.name].code, 0, algorithm_code("adasum"), 0, 0)
    return np.array(fields + tuple(-v for v in fields), dtype=np.int64)


def _wire(array):
    """What MPI sends of ``array``: float16 as its int16 bits."""
    return array.view(np.int16) if array.dtype == np.float16 else array


def _halve_and_double(comm, values, rank, size):
    """Adasum of ``values`` over ``size`` (a power of two) ranks, in place."""
    count = values.shape[0]
    theirs_all = np.empty(count - count // 2, dtype=values.dtype)
    lo, hi, distance, levels = 0, count, 1, []
    while distance < size:
        peer, left = rank ^ distance, not rank & distance
        mid = lo + (hi - lo) // 2   # as Horovod: the left rank keeps the shorter half
        keep, send = ((lo, mid), (mid, hi)) if left else ((mid, hi), (lo, mid))
        theirs = theirs_all[:keep[1] - keep[0]]
        comm.Sendrecv(_wire(values[send[0]:send[1]]), peer, DATA_TAG,
                      _wire(theirs), peer, DATA_TAG)
        _combine(comm, values[keep[0]:keep[1]], theirs, left, rank, distance)
        levels.append((peer, keep, send))
        lo, hi = keep
        distance <<= 1
    # Backwards: what I kept is final now, and what I sent is final at the partner.
    for peer, keep, send in reversed(levels):
        comm.Sendrecv(_wire(values[keep[0]:keep[1]]), peer, DATA_TAG,
                      _wire(values[send[0]:send[1]]), peer, DATA_TAG)


def _combine(comm, mine, theirs, left, rank, distance):
    # mine: my piece of my group's vector; theirs: the same piece of the partner group's.
    # The left group's norm goes first in the sum, so that both groups add like to like.
    a, b = mine.astype(np.float64), theirs.astype(np.float64)
    a_sq, b_sq = a @ a, b @ b
    dots = np.array([a @ b, a_sq, b_sq] if left else [a @ b, b_sq, a_sq])
    _group_sum(comm, dots, rank, distance)
    dot, a_sq, b_sq = (dots[0], dots[1], dots[2]) if left else (dots[0], dots[2], dots[1])
    a *= _coefficient(dot, a_sq)
    b *= _coefficient(dot, b_sq)
    a += b
    mine[...] = a


def _coefficient(dot, norm_sq):
    return 1.0 - 0.5 * dot / norm_sq if norm_sq >= SQRT_DBL_MIN else 1.0


def _group_sum(comm, dots, rank, distance):
    # Recursive doubling over the 2 * distance ranks that hold pieces of this level's vectors.
    incoming = np.empty_like(dots)
    mask = 1
    while mask <= distance:
        peer = rank ^ mask
        comm.Sendrecv(dots, peer, DOTS_TAG, incoming, peer, DOTS_TAG)
        dots += incoming
        mask <<= 1
