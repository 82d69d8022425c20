"""Ring allgather: ``p - 1`` steps around a ring, each passing on the block received last.

Rank ``r`` puts its own block in place in ``recv``; in step ``s`` it sends block ``r - s``
to ``r + 1`` and receives block ``r - s - 1`` from ``r - 1``, straight into place. These
steps are the ring allreduce's allgather phase: the same function (:func:`.ring.allgather`)
on the blocks' own offsets (:func:`.ring.ring_of_blocks`), whatever their sizes.

Cost for ``n`` bytes gathered: ``(p-1)α + n(p-1)/p β`` with equal blocks (a step with
unequal blocks lasts as long as its largest). Every rank receives the ``n(p-1)/p`` bytes it
lacks, the lower bound, so the ring wins for large messages; its ``p - 1`` latencies make
it lose to the butterfly's ``lg p`` for small ones.
"""

from .algorithm import flat_cost, place
from .allgather_call import AllgatherAlgorithm
from .registry import register
from .ring import allgather, ring_of_blocks


@register
class RingAllgather(AllgatherAlgorithm):
    """Ring allgather: the ring allreduce's second phase on the ranks' blocks."""

    name = "ring"

    def run(self, comm, send, recv, bounds):
        rank = comm.Get_rank()
        place(recv[bounds[rank]:bounds[rank + 1]], send)
        allgather(comm, recv, ring_of_blocks(comm.Get_size(), rank, bounds), self.tag)

    def cost(self, nbytes, ranks, nodes, params):
        n, p = nbytes, ranks
        return flat_cost(p - 1, n * (p - 1) / p, 0, nodes)
