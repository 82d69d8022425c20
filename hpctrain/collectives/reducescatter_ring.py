"""Ring reduce-scatter: ``p - 1`` steps around a ring, each adding one block on the way.

In step ``s`` rank ``r`` sends its partial sum of block ``r - s - 1`` to ``r + 1`` and adds
the partial sum of block ``r - s - 2`` that arrives from ``r - 1``; after ``p - 1`` steps it
holds the complete sum of block ``r``, which it copies to ``recv``. These steps are the ring
allreduce's reduce-scatter phase: the same function (:func:`.ring.reduce_scatter`) on the
blocks' own offsets (:func:`.ring.ring_of_blocks`), whatever their sizes.

Cost for ``n`` bytes reduced: ``(p-1)α + n(p-1)/p β + n(p-1)/p γ`` with equal blocks.
Every rank sends and reduces ``n(p-1)/p`` bytes, the lower bound: the ring wins for large
messages and loses to the butterfly's ``lg p`` latencies for small ones.
"""

from .algorithm import flat_cost
from .reducescatter_call import ReduceScatterAlgorithm
from .registry import register
from .ring import reduce_scatter, ring_of_blocks


@register
class RingReduceScatter(ReduceScatterAlgorithm):
    """Ring reduce-scatter: the ring allreduce's first phase on the ranks' blocks."""

    name = "ring"

    def workspace(self, size, rank, bounds):
        return ring_of_blocks(size, rank, bounds).scratch

    def run(self, comm, send, recv, bounds, reduction):
        rank = comm.Get_rank()
        sched = ring_of_blocks(comm.Get_size(), rank, bounds)
        reduce_scatter(comm, send, sched, reduction.scratch, reduction.reduce, self.tag)
        recv[:] = send[bounds[rank]:bounds[rank + 1]]

    def cost(self, nbytes, ranks, nodes, params):
        n, p = nbytes, ranks
        return flat_cost(p - 1, n * (p - 1) / p, n * (p - 1) / p, nodes)
