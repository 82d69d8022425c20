"""Butterfly reduce-scatter: recursive halving, any number of ranks.

On ``p' = 2^⌊lg p⌋`` (virtual) ranks, in step ``k`` every rank sends the half of its
remaining range that it will not keep to the rank whose number differs in bit ``lg p' - k``
and adds the partner's copy of the half it keeps: after ``lg p'`` steps it holds its own
block, complete. These are the Rabenseifner allreduce's reduce-scatter steps
(:func:`.butterfly.recursive_halving`), cut at the ranks' own block offsets.

Other ``p``: the ``r = p - p'`` extra ranks are folded in (:func:`.butterfly.folding`): the
first ``2r`` ranks pair up, the even one of a pair sends its whole vector to the odd one
above it, which adds it and stands for both (their blocks are adjacent: one virtual block),
and at the end sends the even one its block. Blocks of any sizes, zero included.

Cost for ``n`` bytes: ``lg p' α + n(p'-1)/p' β + n(p'-1)/p' γ``, plus ``2α + (n + n/p)β +
nγ`` on the folded pairs when ``p`` is not a power of two. The fewest latencies: wins for
small messages, and on a power of two for large ones too (the ring's bytes with ``lg p``
latencies).
"""

import math

from .algorithm import flat_cost
from .butterfly import block_butterfly, hand_over, recursive_halving
from .reducescatter_call import ReduceScatterAlgorithm
from .registry import register


@register
class ButterflyReduceScatter(ReduceScatterAlgorithm):
    """Recursive halving; extra ranks folded into their neighbour."""

    name = "butterfly"

    def workspace(self, size, rank, bounds):
        return block_butterfly(size, rank, bounds).scratch

    def run(self, comm, send, recv, bounds, reduction):
        rank, tag, reduce = comm.Get_rank(), self.tag, reduction.reduce
        sched = block_butterfly(comm.Get_size(), rank, bounds)
        partner = sched.partner
        if sched.fold == "out":
            hand_over(comm, send, recv, partner, tag)    # my vector; my block back
            return
        if sched.fold == "in":
            incoming = reduction.scratch[:bounds[-1]]
            comm.Recv(incoming, partner, tag)
            reduce(send, incoming)
        recursive_halving(comm, send, reduction.scratch, reduce, sched.steps, tag)
        if sched.fold == "in":
            comm.Send(send[bounds[partner]:bounds[partner + 1]], partner, tag)
        recv[:] = send[bounds[rank]:bounds[rank + 1]]

    def cost(self, nbytes, ranks, nodes, params):
        n, p, low = nbytes, ranks, 1 << (ranks.bit_length() - 1)
        fold = p != low
        share = n * (low - 1) / low
        return flat_cost(math.log2(low) + 2 * fold, share + (n + n / p) * fold,
                         share + n * fold, nodes)
