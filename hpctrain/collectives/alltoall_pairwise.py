"""Pairwise alltoall: ``p - 1`` exchanges, in step ``s`` with ranks ``rank ± s``.

Rank ``r`` copies its own block, then in step ``s = 1 .. p-1`` sends its block for
``r + s`` and receives the block of ``r - s``, one ``Sendrecv`` each: every rank sends to
one rank and receives from one other in each step, so no link or receiver is shared.

Cost for ``n`` bytes sent by each rank: ``(p-1)α + n(p-1)/p β`` with equal blocks, the
lower bound on bytes; only a store-and-forward (Bruck) algorithm, ``lg p`` messages of
``n/2`` bytes each, has fewer latencies, for tiny blocks.
"""

from .algorithm import flat_cost, place
from .alltoall_call import AlltoallAlgorithm
from .registry import register


@register
class PairwiseAlltoall(AlltoallAlgorithm):
    """``p - 1`` Sendrecv steps, to ``rank + s`` and from ``rank - s``."""

    name = "pairwise"

    def run(self, comm, send, send_bounds, recv, recv_bounds):
        size, rank, tag = comm.Get_size(), comm.Get_rank(), self.tag
        place(recv[recv_bounds[rank]:recv_bounds[rank + 1]],
              send[send_bounds[rank]:send_bounds[rank + 1]])
        # In step s rank r sends to r + s, which receives from (r + s) - s = r in the same
        # step: each send meets its receive in one Sendrecv. A blocking Send first would
        # deadlock a ring of ranks all sending, once blocks pass MPI's eager limit.
        for step in range(1, size):
            dest, source = (rank + step) % size, (rank - step) % size
            comm.Sendrecv(send[send_bounds[dest]:send_bounds[dest + 1]], dest, tag,
                          recv[recv_bounds[source]:recv_bounds[source + 1]], source, tag)

    def cost(self, nbytes, ranks, nodes, params):
        n, p = nbytes, ranks
        return flat_cost(p - 1, n * (p - 1) / p, 0, nodes)
