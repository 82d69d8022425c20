"""Ring allreduce: a reduce-scatter then an allgather around a logical ring.

The vector is cut into ``p`` chunks whose sizes differ by at most one element. In each of
the ``p - 1`` reduce-scatter steps every rank sends one chunk to ``rank + 1`` and receives
another from ``rank - 1``, which it adds to its own copy; afterwards rank ``r`` holds the
complete sum of chunk ``r + 1``. The ``p - 1`` allgather steps pass the complete chunks on
around the ring, received straight into place.

Cost: ``2(p-1)α + 2n(p-1)/p β + n(p-1)/p γ``. Every rank sends and receives ``2n(p-1)/p``
bytes, the lower bound for any allreduce, so the ring wins for large messages; its
``2(p-1)`` latencies make it lose for small ones.

The two phases are written as functions of any chunk bounds (:func:`ring_over`), so that
other algorithms can run them on a sub-communicator (see :mod:`.hierarchical`), and they
are the whole of the ring reduce-scatter and ring allgather collectives
(:mod:`.reducescatter_ring`, :mod:`.allgather_ring`), whose rank ``r`` owns block ``r``
(:func:`ring_of_blocks`): one implementation of each phase.
"""

from dataclasses import dataclass
from functools import lru_cache

from .algorithm import Algorithm, chunk_bounds, flat_cost, register


@dataclass(frozen=True)
class RingSchedule:
    """The ring's neighbours and, per step, the (send, receive) element bounds."""

    right: int
    left: int
    reduce_scatter: tuple     # ((send_lo, send_hi, recv_lo, recv_hi), ...)
    allgather: tuple
    scratch: int              # elements of receive workspace: the largest chunk


@lru_cache(maxsize=256)
def ring_schedule(size, rank, count):
    """The ring schedule of ``rank`` among ``size`` ranks for ``count`` elements."""
    return ring_over(size, rank, chunk_bounds(count, size))


@lru_cache(maxsize=256)
def ring_of_blocks(size, rank, bounds):
    """The ring schedule in which rank ``r`` owns block ``r`` of ``bounds`` (the
    reduce-scatter and allgather collectives: offsets of the ranks' blocks)."""
    return ring_over(size, rank, bounds, owned=0)


def ring_over(size, rank, bounds, owned=1):
    """The ring schedule of ``rank`` among ``size`` ranks for the ``size`` chunks whose
    element offsets are ``bounds``; rank ``r`` ends the reduce-scatter owning chunk
    ``(r + owned) % size`` and starts the allgather with it (allreduce: ``owned=1``,
    :func:`owned_chunk`, so that its first message is its own chunk)."""
    def step(send, recv):
        send, recv = send % size, recv % size
        return bounds[send], bounds[send + 1], bounds[recv], bounds[recv + 1]

    first = rank + owned - 1      # the chunk sent first in the reduce-scatter
    reduce_scatter = tuple(step(first - s, first - s - 1) for s in range(size - 1))
    allgather = tuple(step(first + 1 - s, first - s) for s in range(size - 1))
    largest = max(bounds[i + 1] - bounds[i] for i in range(size))
    return RingSchedule((rank + 1) % size, (rank - 1) % size, reduce_scatter, allgather,
                        largest)


def owned_chunk(size, rank):
    """The chunk whose complete sum ``rank`` holds after the reduce-scatter."""
    return (rank + 1) % size


def reduce_scatter(comm, flat, sched, scratch, reduce, tag):
    """The ring's reduce-scatter of ``flat`` over ``comm`` (``p - 1`` steps)."""
    right, left = sched.right, sched.left
    # Sendrecv pairs each send with its receive: with a blocking Send to the right first,
    # every rank would wait for its neighbour to receive, a deadlock as soon as chunks are
    # too large for MPI to buffer.
    for send_lo, send_hi, recv_lo, recv_hi in sched.reduce_scatter:
        incoming = scratch[:recv_hi - recv_lo]
        comm.Sendrecv(flat[send_lo:send_hi], right, tag, incoming, left, tag)
        reduce(flat[recv_lo:recv_hi], incoming)


def allgather(comm, flat, sched, tag):
    """The ring's allgather of the complete chunks of ``flat`` over ``comm``."""
    right, left = sched.right, sched.left
    for send_lo, send_hi, recv_lo, recv_hi in sched.allgather:
        comm.Sendrecv(flat[send_lo:send_hi], right, tag, flat[recv_lo:recv_hi], left, tag)


@register
class Ring(Algorithm):
    """Ring allreduce (reduce-scatter + allgather); bandwidth-optimal for large messages."""

    name = "ring"
    chosen_by_model = True

    def schedule(self, size, rank, count, itemsize, params, setup=None):
        return ring_schedule(size, rank, count)

    def run(self, comm, flat, plan):
        reduce_scatter(comm, flat, plan.schedule, plan.scratch, plan.reduce, self.tag)
        allgather(comm, flat, plan.schedule, self.tag)

    def bind(self, comm, plan):
        """An average (``plan.finish``) is taken of the one chunk this rank owns, between
        the two phases, and the allgather spreads the quotients: ``n/p`` divisions per rank
        instead of ``n`` after the allgather, on a chunk that was just written. Every
        element is still the complete sum divided once, so the result is the same."""
        finish = plan.finish
        if finish is None:
            return super().bind(comm, plan)
        sched, scratch, reduce, tag = plan.schedule, plan.scratch, plan.reduce, self.tag
        lo, hi = sched.allgather[0][:2]       # the first chunk sent on is the one owned

        def run(flat):
            reduce_scatter(comm, flat, sched, scratch, reduce, tag)
            finish(flat[lo:hi])
            allgather(comm, flat, sched, tag)
        return run

    def cost(self, nbytes, ranks, nodes, params):
        n, p = nbytes, ranks
        return flat_cost(2 * (p - 1), 2 * n * (p - 1) / p, n * (p - 1) / p, nodes)
