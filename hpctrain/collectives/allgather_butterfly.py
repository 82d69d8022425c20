"""Butterfly allgather: recursive doubling, any number of ranks.

On ``p' = 2^⌊lg p⌋`` (virtual) ranks, in step ``k`` every rank swaps everything it holds
with the rank whose number differs in bit ``k``: after ``lg p'`` steps everyone holds
everything. These are the Rabenseifner allreduce's allgather steps
(:func:`.butterfly.recursive_doubling_gather`) on the ranks' own blocks.

Other ``p``: the ``r = p - p'`` extra ranks are folded in (:func:`.butterfly.folding`, as in
the butterfly allreduce): the first ``2r`` ranks pair up, the even one of a pair sends its
block to the odd one above it and waits; the odd one stands for both in the butterfly (their
blocks are adjacent, so one contiguous virtual block) and at the end sends the whole result
back. Blocks of any sizes, zero included.

Cost for ``n`` bytes gathered: ``lg p' α + n(p'-1)/p' β``, plus ``2α + nβ`` on the folded
pairs when ``p`` is not a power of two. The fewest latencies: wins for small messages; the
ring's equal-sized steps win for large ones where ``p`` is not a power of two.
"""

import math

from .algorithm import flat_cost, place
from .allgather_call import AllgatherAlgorithm
from .butterfly import block_butterfly, hand_over, recursive_doubling_gather
from .registry import register


@register
class ButterflyAllgather(AllgatherAlgorithm):
    """Recursive doubling; extra ranks folded into their neighbour."""

    name = "butterfly"

    def run(self, comm, send, recv, bounds):
        rank, tag = comm.Get_rank(), self.tag
        sched = block_butterfly(comm.Get_size(), rank, bounds)
        partner = sched.partner
        if sched.fold == "out":
            hand_over(comm, send, recv, partner, tag)    # my block; every block back
            return
        place(recv[bounds[rank]:bounds[rank + 1]], send)
        if sched.fold == "in":
            comm.Recv(recv[bounds[partner]:bounds[partner + 1]], partner, tag)
        recursive_doubling_gather(comm, recv, sched.steps, tag)
        if sched.fold == "in":
            comm.Send(recv, partner, tag)

    def cost(self, nbytes, ranks, nodes, params):
        n, low = nbytes, 1 << (ranks.bit_length() - 1)
        fold = ranks != low
        return flat_cost(math.log2(low) + 2 * fold, n * (low - 1) / low + n * fold, 0, nodes)
