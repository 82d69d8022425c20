"""Ring allreduce: a reduce-scatter then an allgather around a logical ring.

The vector is cut into ``p`` chunks whose sizes differ by at most one element. In each of
the ``p - 1`` reduce-scatter steps every rank sends one chunk to ``rank + 1`` and receives
another from ``rank - 1``, which it adds to its own copy; afterwards rank ``r`` holds the
complete sum of chunk ``r + 1``. The ``p - 1`` allgather steps pass the complete chunks on
around the ring, received straight into place.

Cost: ``2(p-1)α + 2n(p-1)/p β + n(p-1)/p γ``. Every rank sends and receives ``2n(p-1)/p``
bytes, the lower bound for any allreduce, so the ring wins for large messages; its
``2(p-1)`` latencies make it lose for small ones.
"""

from dataclasses import dataclass
from functools import lru_cache

from .base import Algorithm, chunk_bounds, register


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
    bounds = chunk_bounds(count, size)

    def step(send, recv):
        send, recv = send % size, recv % size
        return bounds[send], bounds[send + 1], bounds[recv], bounds[recv + 1]

    reduce_scatter = tuple(step(rank - s, rank - s - 1) for s in range(size - 1))
    allgather = tuple(step(rank + 1 - s, rank - s) for s in range(size - 1))
    largest = bounds[1] - bounds[0]
    return RingSchedule((rank + 1) % size, (rank - 1) % size, reduce_scatter, allgather,
                        largest)


@register
class Ring(Algorithm):
    """Ring allreduce (reduce-scatter + allgather); bandwidth-optimal for large messages."""

    name = "ring"
    tag = 11

    def schedule(self, size, rank, count, itemsize, params):
        return ring_schedule(size, rank, count)

    def run(self, comm, flat, plan):
        sched, scratch, reduce, tag = plan.schedule, plan.scratch, plan.reduce, self.tag
        right, left = sched.right, sched.left
        # Sendrecv pairs each send with its receive: with a blocking Send to the right
        # first, every rank would wait for its neighbour to receive, a deadlock as soon as
        # chunks are too large for MPI to buffer.
        for send_lo, send_hi, recv_lo, recv_hi in sched.reduce_scatter:
            incoming = scratch[:recv_hi - recv_lo]
            comm.Sendrecv(flat[send_lo:send_hi], right, tag, incoming, left, tag)
            reduce(flat[recv_lo:recv_hi], incoming)
        for send_lo, send_hi, recv_lo, recv_hi in sched.allgather:
            comm.Sendrecv(flat[send_lo:send_hi], right, tag, flat[recv_lo:recv_hi], left, tag)
