"""Butterfly allreduce: recursive doubling for small messages, Rabenseifner for large ones.

Both work on a power of two ``p' = 2^⌊lg p⌋`` of ranks. With ``r = p - p'`` extra ranks,
the first ``2r`` ranks pair up first (as MPICH does): each even one sends its whole vector
to the odd one above it and sits out; at the end it gets the result back. That costs two
extra messages of ``n`` bytes on those ranks.

- *Recursive doubling* (messages below ``switch_bytes``): in step ``k`` every rank swaps its
  whole vector with the rank whose number differs in bit ``k`` and adds it:
  ``lg p α + n lg p β + n lg p γ`` — the fewest latencies, so the best for small messages.
- *Rabenseifner* (``switch_bytes`` and above): a reduce-scatter by recursive halving (swap
  half of the remaining range with the partner, keep and reduce the other half) then an
  allgather by recursive doubling, which retraces the steps backwards:
  ``2 lg p α + 2n(p-1)/p β + n(p-1)/p γ`` — the ring's bandwidth with logarithmic latency.

Option ``switch_bytes`` (default 64 KiB): the message size from which Rabenseifner is used.
"""

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .algorithm import Algorithm, chunk_bounds, flat_cost
from .dtypes import mpi_datatype
from .kernels import add_few
from .registry import register
from ..errors import UsageError

SWITCH_BYTES = 64 * 1024


@dataclass(frozen=True)
class ButterflySchedule:
    """The fold partner and the steps of one of the two butterflies."""

    fold: str                 # "out": send to partner and wait; "in": take partner's; ""
    partner: int              # the folding partner, or -1
    halving: bool             # True: Rabenseifner; False: recursive doubling
    steps: tuple              # doubling: (peer, ...); halving: ((peer, s_lo, s_hi, k_lo, k_hi),)
    scratch: int


@lru_cache(maxsize=256)
def butterfly_schedule(size, rank, count, halving):
    """The butterfly of ``rank`` among ``size`` ranks for ``count`` elements."""
    fold, partner, vrank, pof2, extra = folding(size, rank)
    if fold == "out":
        return ButterflySchedule("out", partner, halving, (), 0)
    if not halving:
        steps = tuple(real_rank(vrank ^ mask, extra) for mask in _masks(pof2))
        return ButterflySchedule(fold, partner, False, steps, count)
    steps = halving_steps(vrank, pof2, extra, chunk_bounds(count, pof2))
    # What arrives in a halving step is the partner's half, the size of the half I keep.
    largest = max((k_hi - k_lo for _, _, _, k_lo, k_hi in steps), default=0)
    return ButterflySchedule(fold, partner, True, steps, count if fold == "in" else largest)


def folding(size, rank):
    """``(fold, partner, vrank, pof2, extra)``: how ``rank`` takes part in a butterfly of
    ``pof2 = 2^⌊lg size⌋`` virtual ranks. The first ``2·extra`` ranks pair up: the even one
    folds ``"out"`` (hands its data to ``partner``, the odd one above it, and sits out), the
    odd one folds ``"in"`` and is virtual rank ``rank // 2``; the others are ``rank - extra``.
    An "out" rank has no virtual rank (-1)."""
    pof2 = 1 << (size.bit_length() - 1)
    extra = size - pof2
    if rank < 2 * extra:
        if rank % 2 == 0:
            return "out", rank + 1, -1, pof2, extra
        return "in", rank - 1, rank // 2, pof2, extra
    return "", -1, rank - extra, pof2, extra


def real_rank(vrank, extra):
    """The rank that plays virtual rank ``vrank`` (see :func:`folding`)."""
    return 2 * vrank + 1 if vrank < extra else vrank + extra


def halving_steps(vrank, pof2, extra, bounds):
    """The recursive halving of virtual rank ``vrank`` over the ``pof2`` virtual chunks whose
    offsets are ``bounds``: ``((peer, send_lo, send_hi, keep_lo, keep_hi), ...)``, the
    partner differing in one bit, highest first; ``vrank`` ends holding chunk ``vrank``.
    Backwards, the same steps are the recursive doubling of an allgather."""
    lo, hi, steps = 0, pof2, []
    for mask in reversed(_masks(pof2)):
        mid = (lo + hi) // 2
        send, keep = ((lo, mid), (mid, hi)) if vrank & mask else ((mid, hi), (lo, mid))
        steps.append((real_rank(vrank ^ mask, extra), bounds[send[0]], bounds[send[1]],
                      bounds[keep[0]], bounds[keep[1]]))
        lo, hi = keep
    return tuple(steps)


@dataclass(frozen=True)
class BlockButterfly:
    """A butterfly over the ranks' own blocks (reduce-scatter and allgather collectives)."""

    fold: str                 # as in ButterflySchedule
    partner: int
    steps: tuple              # halving steps over the virtual ranks' blocks
    scratch: int              # receive workspace of the reduce-scatter (elements)


@lru_cache(maxsize=256)
def block_butterfly(size, rank, bounds):
    """The butterfly in which rank ``r`` ends with (reduce-scatter) or starts from
    (allgather) block ``r`` of ``bounds``. A virtual rank's block is its real ranks' blocks
    side by side: both of a folded pair's (adjacent, so contiguous), else the rank's own."""
    fold, partner, vrank, pof2, extra = folding(size, rank)
    if fold == "out":
        return BlockButterfly(fold, partner, (), 0)
    virtual = tuple(bounds[2 * v if v < extra else v + extra] for v in range(pof2)) \
        + (bounds[size],)
    steps = halving_steps(vrank, pof2, extra, virtual)
    largest = max((k_hi - k_lo for _, _, _, k_lo, k_hi in steps), default=0)
    return BlockButterfly(fold, partner, steps, bounds[size] if fold == "in" else largest)


def hand_over(comm, send, recv, partner, tag):
    """A folded-out rank's whole part in a block butterfly: ``send`` to ``partner``, then
    its result into ``recv``. The partner posts its receive first, so this blocking Send
    cannot deadlock."""
    comm.Send(send, partner, tag)
    comm.Recv(recv, partner, tag)


def recursive_halving(comm, flat, scratch, reduce, steps, tag):
    """The reduce-scatter by recursive halving of ``flat`` over ``comm``
    (:func:`halving_steps`): swap the half I do not keep, reduce the half I keep."""
    for peer, send_lo, send_hi, keep_lo, keep_hi in steps:
        incoming = scratch[:keep_hi - keep_lo]
        comm.Sendrecv(flat[send_lo:send_hi], peer, tag, incoming, peer, tag)
        reduce(flat[keep_lo:keep_hi], incoming)


def recursive_doubling_gather(comm, flat, steps, tag):
    """The allgather by recursive doubling that retraces ``steps`` backwards: what I kept
    is complete here, and what I sent is complete at the partner."""
    for peer, send_lo, send_hi, keep_lo, keep_hi in reversed(steps):
        comm.Sendrecv(flat[keep_lo:keep_hi], peer, tag, flat[send_lo:send_hi], peer, tag)


def _masks(pof2):
    return [1 << k for k in range(pof2.bit_length() - 1)]


@register
class Butterfly(Algorithm):
    """Recursive doubling below ``switch_bytes``, Rabenseifner from it; any ``p``."""

    name = "butterfly"
    options = {"switch_bytes": SWITCH_BYTES}
    chosen_by_model = True

    def validate(self, size, params):
        if params[0] < 0:
            raise UsageError(f"allreduce option switch_bytes={params[0]} must be >= 0")
        return (int(params[0]),)

    def examples(self, size):
        """The default switch, Rabenseifner always, recursive doubling always."""
        return [{}, {"switch_bytes": 0}, {"switch_bytes": 1 << 40}]

    def schedule(self, size, rank, count, itemsize, params, setup=None):
        return butterfly_schedule(size, rank, count, count * itemsize >= params[0])

    def bind(self, comm, plan):
        sched = plan.schedule
        if sched.fold or sched.halving or plan.finish is not None \
                or not isinstance(plan.scratch, np.ndarray):
            return super().bind(comm, plan)
        # Recursive doubling on a power of two, in host memory: the small-message case,
        # where each microsecond of Python is as long as a message. Hence the bound
        # method, the prebuilt receive message and the explicit datatype (cheaper for
        # mpi4py than reading the array's format).
        sendrecv, reduce, tag, peers = comm.Sendrecv, plan.reduce, self.tag, sched.steps
        datatype = mpi_datatype(plan.dtype)
        incoming = plan.scratch[:plan.count]
        received = [incoming, datatype]

        def recursive_doubling(flat):
            for peer in peers:
                sendrecv([flat, datatype], peer, tag, received, peer, tag)
                reduce(flat, incoming)

        if len(peers) != 1:
            return recursive_doubling
        peer = peers[0]

        def swap_and_add(flat):   # p = 2: no loop (a buffer reduced again: bind_buffer)
            sendrecv([flat, datatype], peer, tag, received, peer, tag)
            reduce(flat, incoming)
        return swap_and_add

    def bind_buffer(self, comm, plan, flat, run):
        sched = plan.schedule
        if sched.fold or sched.halving or plan.finish is not None or len(sched.steps) != 1 \
                or plan.reduce is not add_few or not isinstance(plan.scratch, np.ndarray):
            return super().bind_buffer(comm, plan, flat, run)
        # p = 2, one or two floats summed, the same array every call: the messages are
        # built once, and the adds go through memoryviews, a third of the cost of
        # ``item()`` (the sum is rounded to the array's type on the store, as NumPy does).
        sendrecv, tag, peer = comm.Sendrecv, self.tag, sched.steps[0]
        datatype = mpi_datatype(plan.dtype)
        incoming = plan.scratch[:plan.count]
        # mpi4py reads its own buffer objects a little faster than arrays.
        from mpi4py import MPI

        buffer = MPI.buffer
        send, received = [buffer(flat), datatype], [buffer(incoming), datatype]
        mine, theirs = memoryview(flat), memoryview(incoming)

        def swap_and_add_one():
            sendrecv(send, peer, tag, received, peer, tag)
            mine[0] = mine[0] + theirs[0]

        def swap_and_add_two():
            sendrecv(send, peer, tag, received, peer, tag)
            mine[0] = mine[0] + theirs[0]
            mine[1] = mine[1] + theirs[1]
        return swap_and_add_one if plan.count == 1 else swap_and_add_two

    def run(self, comm, flat, plan):
        sched = plan.schedule
        tag, scratch, reduce = self.tag, plan.scratch, plan.reduce
        if sched.fold == "out":
            comm.Send(flat, sched.partner, tag)
            comm.Recv(flat, sched.partner, tag)
            return
        if sched.fold == "in":
            incoming = scratch[:flat.shape[0]]
            comm.Recv(incoming, sched.partner, tag)
            reduce(flat, incoming)
        if sched.halving:
            _rabenseifner(comm, flat, scratch, reduce, sched.steps, tag)
        else:
            incoming = scratch[:flat.shape[0]]
            for peer in sched.steps:
                comm.Sendrecv(flat, peer, tag, incoming, peer, tag)
                reduce(flat, incoming)
        if sched.fold == "in":
            comm.Send(flat, sched.partner, tag)


    def cost(self, nbytes, ranks, nodes, params):
        """On ``N`` nodes of ``k`` ranks placed by slot, the steps with a partner ``k`` or
        more ranks away cross the node's link, all ``k`` ranks of the node at once: the
        link carries ``k`` times a rank's bytes of those steps. The fold's partners are
        neighbours, on one node."""
        n, low = nbytes, 1 << (ranks.bit_length() - 1)   # largest power of two <= p
        fold = ranks != low   # extra ranks send their data in first and get the result after
        lg = math.log2(low)
        k = max(ranks / max(nodes, 1), 1.0)
        lg_in = min(math.log2(k), lg)          # steps inside a node
        lg_out = lg - lg_in                    # steps between nodes
        if n < params[0]:
            inside = (lg_in, n * lg_in)
            between = (lg_out, k * n * lg_out)
            reduced = n * lg
        else:
            crossing = n * (1 - 2 ** -lg_out)  # the first, largest halves cross
            inside = (2 * lg_in, 2 * (n - crossing) * (1 - 2 ** -lg_in))
            between = (2 * lg_out, 2 * k * crossing)
            reduced = n * (low - 1) / low
        if nodes <= 1:
            return flat_cost(inside[0] + between[0] + 2 * fold,
                             inside[1] + between[1] + 2 * n * fold, reduced + n * fold, 1)
        return (inside[0] + 2 * fold, inside[1] + 2 * n * fold, reduced + n * fold,
                between[0], between[1])


def _rabenseifner(comm, flat, scratch, reduce, steps, tag):
    recursive_halving(comm, flat, scratch, reduce, steps, tag)
    recursive_doubling_gather(comm, flat, steps, tag)
