"""Scatter + allgather broadcast (van de Geijn): the vector in ``p`` chunks, scattered down
the binomial tree, then gathered around a ring.

Ranks are numbered relative to the root (``vrank = (rank - root) mod p``) and the vector is
cut into ``p`` chunks (:func:`.algorithm.chunk_bounds`), chunk ``v`` for virtual rank
``v``. The scatter runs on the tree broadcast's tree (:func:`.tree.tree_schedule`), but a
rank sends each child only the chunks of the child's subtree, virtual ranks ``c`` to
``c + 2^k - 1`` (the child ``c = vrank + 2^k``); afterwards every rank holds its own chunk.
The ring allgather's steps (:func:`.ring.ring_over`) then pass the chunks on, ``rank`` to
``rank + 1`` (virtual ``v`` to ``v + 1``), in ``p - 1`` steps, but with the ring open at
the root: it holds every chunk already, so it only sends, and its left neighbour only
receives. The root's buffer is only read, and no chunk goes back to it.

Cost for ``n`` bytes: ``(⌈lg p⌉ + p - 1)α + 2n(p-1)/p β``: the root sends each other
chunk once in the scatter and once in the allgather, where every other rank receives the
``p - 1`` chunks it lacks. Against the tree's ``n⌈lg p⌉`` bytes this wins for large
messages from ``p = 3`` (``4n/3 < 2n``); its ``p - 1`` more latencies make it lose for
small ones.
"""

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from .algorithm import chunk_bounds, flat_cost
from .broadcast_call import BroadcastAlgorithm
from .registry import register
from .ring import RingSchedule, ring_over
from .tree import tree_schedule


@dataclass(frozen=True)
class ScatterAllgatherSchedule:
    """This rank's part: the scatter's receive and sends (byte bounds), then the ring."""

    parent: object            # rank, or None at the root
    receive: tuple            # (lo, hi): the chunks of this rank's subtree, from the parent
    sends: tuple              # ((child, lo, hi), ...): each child's subtree, largest first
    ring: RingSchedule        # neighbours: None where the ring is open (at the root)


@lru_cache(maxsize=256)
def scatter_allgather_schedule(size, rank, nbytes, root):
    """The scatter + allgather of ``nbytes`` from ``root`` among ``size`` ranks, seen from
    ``rank``."""
    bounds = chunk_bounds(nbytes, size)
    vrank = (rank - root) % size

    def subtree(first, span):   # the bytes of virtual ranks first .. first + span - 1
        return bounds[first], bounds[min(first + span, size)]

    tree = tree_schedule(size, rank, 0, root)
    sends = []
    for child in reversed(tree.children):
        first = (child - root) % size
        sends.append((child, *subtree(first, first - vrank)))
    # A subtree spans the lowest set bit of its vrank; the root's (vrank 0) spans every rank.
    receive = subtree(vrank, vrank & -vrank or size)
    # The ring of the chunks in virtual order; its neighbours are real ranks (virtual rank
    # v + 1 is real rank + 1), none between the last virtual rank and the root.
    ring = replace(ring_over(size, vrank, bounds, owned=0),
                   right=None if vrank == size - 1 else (rank + 1) % size,
                   left=None if vrank == 0 else (rank - 1) % size)
    return ScatterAllgatherSchedule(tree.parent, receive, tuple(sends), ring)


def pass_on(comm, buf, ring, tag):
    """The allgather around the ring opened at the root: each step sends one chunk right
    and receives the next from the left. The root only sends and its left neighbour only
    receives, so the ranks form a pipeline with no cycle: a blocking Send cannot deadlock,
    and Sendrecv pairs each middle rank's send with its receive."""
    right, left = ring.right, ring.left
    for send_lo, send_hi, recv_lo, recv_hi in ring.allgather:
        if left is None:
            comm.Send(buf[send_lo:send_hi], right, tag)
        elif right is None:
            comm.Recv(buf[recv_lo:recv_hi], left, tag)
        else:
            comm.Sendrecv(buf[send_lo:send_hi], right, tag, buf[recv_lo:recv_hi], left, tag)


@register
class ScatterAllgatherBroadcast(BroadcastAlgorithm):
    """Binomial scatter of ``p`` chunks, then ring allgather (van de Geijn)."""

    name = "scatter_allgather"
    tags = 2     # the scatter's and the ring's messages apart

    def run(self, comm, buf, root):
        sched = scatter_allgather_schedule(comm.Get_size(), comm.Get_rank(), len(buf), root)
        tag = self.tag
        if sched.parent is not None:
            lo, hi = sched.receive
            comm.Recv(buf[lo:hi], sched.parent, tag)
        # A child's first call is its receive from this rank: these blocking sends cannot
        # deadlock.
        for child, lo, hi in sched.sends:
            comm.Send(buf[lo:hi], child, tag)
        pass_on(comm, buf, sched.ring, tag + 1)

    def cost(self, nbytes, ranks, nodes, params):
        n, p = nbytes, ranks
        return flat_cost(math.ceil(math.log2(p)) + p - 1, 2 * n * (p - 1) / p, 0, nodes)
