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

Messages whole or in segments (option ``segment_bytes``). Over TCP, Open MPI keeps one
connection per pair of ranks, and a large message's rendezvous handshake queues behind the
bulk data the other direction already sent on it. When a rank's left and right neighbour
are the same rank (two ranks, or two nodes in :mod:`.hierarchical`), each step is a
pairwise exchange of large messages and the two directions take turns: measured at 2
emulated hosts, 201 ms for 16 MiB in whole messages against 136 ms in segments
(docs/collectives.md). Segments under the eager limit need no
handshake and flow both ways at once (:func:`exchange`). They cost a few microseconds of
Python each, so the default (``None``) cuts messages only where the trap is: two ranks on
two nodes. ``0`` sends whole messages (one ``Sendrecv`` per step) everywhere, the right
choice on an RDMA network; ``k > 0`` cuts every message into ``k``-byte segments. Where a
call gives no ``segment_bytes``, ``$HPCTRAIN_SEGMENT_BYTES`` does (for the hierarchical
allreduce's ring between nodes too), so that a launch line can choose for a whole job.
"""

from dataclasses import dataclass
from functools import lru_cache

from .algorithm import Algorithm, chunk_bounds, count_option, flat_cost, waitall
from .registry import register
from ..devices import ranks_on_node

#: Segment of a message cut for the network: under Open MPI's TCP eager limit (64 KiB
#: including the header), so that no segment waits for a rendezvous handshake.
SEGMENT_BYTES = 32 * 1024
#: Environment variable giving ``segment_bytes`` where a call does not.
SEGMENT_ENV = "HPCTRAIN_SEGMENT_BYTES"
#: Segments sent before waiting for them: enough to keep the link busy (512 KiB), few enough
#: that a peer still busy elsewhere is not flooded with unexpected messages (posting every
#: segment at once made one call in four or five 2-3 times slower).
WINDOW = 16


@dataclass(frozen=True)
class RingSchedule:
    """The ring's neighbours and, per step, the (send, receive) element bounds."""

    right: int
    left: int
    reduce_scatter: tuple     # ((send_lo, send_hi, recv_lo, recv_hi), ...)
    allgather: tuple
    scratch: int              # elements of receive workspace: the largest chunk
    segment: int = 0          # elements per message (0: whole messages)


@lru_cache(maxsize=256)
def ring_schedule(size, rank, count, segment=0):
    """The ring schedule of ``rank`` among ``size`` ranks for ``count`` elements, messages
    cut into ``segment`` elements (0: whole)."""
    return ring_over(size, rank, chunk_bounds(count, size), segment=segment)


@lru_cache(maxsize=256)
def ring_of_blocks(size, rank, bounds):
    """The ring schedule in which rank ``r`` owns block ``r`` of ``bounds`` (the
    reduce-scatter and allgather collectives: offsets of the ranks' blocks)."""
    return ring_over(size, rank, bounds, owned=0)


def ring_over(size, rank, bounds, owned=1, segment=0):
    """The ring schedule of ``rank`` among ``size`` ranks for the ``size`` chunks whose
    element offsets are ``bounds``; rank ``r`` ends the reduce-scatter owning chunk
    ``(r + owned) % size`` and starts the allgather with it (allreduce: ``owned=1``,
    :func:`owned_chunk`, so that its first message is its own chunk); messages of at most
    ``segment`` elements (0: whole)."""
    def step(send, recv):
        send, recv = send % size, recv % size
        return bounds[send], bounds[send + 1], bounds[recv], bounds[recv + 1]

    first = rank + owned - 1      # the chunk sent first in the reduce-scatter
    reduce_scatter = tuple(step(first - s, first - s - 1) for s in range(size - 1))
    allgather = tuple(step(first + 1 - s, first - s) for s in range(size - 1))
    largest = max(bounds[i + 1] - bounds[i] for i in range(size))
    return RingSchedule((rank + 1) % size, (rank - 1) % size, reduce_scatter, allgather,
                        largest, segment)


def owned_chunk(size, rank):
    """The chunk whose complete sum ``rank`` holds after the reduce-scatter."""
    return (rank + 1) % size


def segment_bytes(value, default):
    """The ``segment_bytes`` option: ``value`` if given, else ``$HPCTRAIN_SEGMENT_BYTES``,
    else ``default``."""
    return count_option("segment_bytes", value, SEGMENT_ENV, default,
                        "the bytes per message, or 0 for whole messages")


def segments(length, segment):
    """``(lo, hi)`` of consecutive pieces of at most ``segment`` elements covering
    ``length`` (one piece if ``segment`` is 0)."""
    step = segment or max(length, 1)
    return [(lo, min(lo + step, length)) for lo in range(0, length, step)]


def exchange(comm, send, dest, recv, source, tag, segment):
    """Send ``send`` to ``dest`` while receiving ``recv`` from ``source``.

    Whole (``segment`` 0): one ``Sendrecv``, which pairs the send with its receive; a
    blocking ``Send`` first would make every rank wait for its neighbour to receive, a
    deadlock as soon as messages are too large for MPI to buffer. In segments: every
    receive posted first, so that eager data finds its buffer, then the sends in windows of
    :data:`WINDOW`; no deadlock, since a rank waits on its sends only after posting all its
    receives."""
    if not segment:
        comm.Sendrecv(send, dest, tag, recv, source, tag)
        return
    receives = [comm.Irecv(recv[lo:hi], source, tag) for lo, hi in segments(len(recv), segment)]
    pieces = segments(len(send), segment)
    for first in range(0, len(pieces), WINDOW):
        waitall([comm.Isend(send[lo:hi], dest, tag) for lo, hi in pieces[first:first + WINDOW]])
    waitall(receives)


def reduce_scatter(comm, flat, sched, scratch, reduce, tag):
    """The ring's reduce-scatter of ``flat`` over ``comm`` (``p - 1`` steps)."""
    right, left, segment = sched.right, sched.left, sched.segment
    for send_lo, send_hi, recv_lo, recv_hi in sched.reduce_scatter:
        incoming = scratch[:recv_hi - recv_lo]
        exchange(comm, flat[send_lo:send_hi], right, incoming, left, tag, segment)
        reduce(flat[recv_lo:recv_hi], incoming)


def allgather(comm, flat, sched, tag):
    """The ring's allgather of the complete chunks of ``flat`` over ``comm``."""
    right, left, segment = sched.right, sched.left, sched.segment
    for send_lo, send_hi, recv_lo, recv_hi in sched.allgather:
        exchange(comm, flat[send_lo:send_hi], right, flat[recv_lo:recv_hi], left, tag, segment)


@register
class Ring(Algorithm):
    """Ring allreduce (reduce-scatter + allgather); bandwidth-optimal for large messages."""

    name = "ring"
    options = {"segment_bytes": None}
    has_setup = True
    chosen_by_model = True

    def validate(self, size, params):
        return (segment_bytes(params[0], None),)

    def examples(self, size):
        """The default, whole messages, and 1 KiB segments (several per message)."""
        return [{}, {"segment_bytes": 0}, {"segment_bytes": 1024}]

    def setup(self, comm, params):
        """The bytes per message (0: whole). Unset, it asks, on two ranks only, whether
        they share a node (:func:`~hpctrain.devices.ranks_on_node`, collective: the same
        decision on every rank, since it rests on the size alone)."""
        if params[0] is not None:
            return params[0]
        if comm.Get_size() != 2:
            return 0
        return SEGMENT_BYTES if ranks_on_node(comm) == 1 else 0

    def schedule(self, size, rank, count, itemsize, params, setup=None):
        return ring_schedule(size, rank, count, max(setup // itemsize, 1) if setup else 0)

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
