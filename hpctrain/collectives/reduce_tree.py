"""Binomial-tree reduce: ``⌈lg p⌉`` rounds toward the root, reducing on the way.

Ranks are numbered relative to the root (``vrank = (rank - root) mod p``) on the tree
allreduce's tree (:func:`.tree.tree_schedule`): in round ``k`` (mask ``2^k``) every rank
whose ``vrank`` has bit ``k`` set sends its partial result to ``vrank - 2^k`` and drops out,
having first reduced into it those of its children ``vrank + 2^j``, ``j < k``. These steps
are the tree allreduce's reduce phase: the same function (:func:`.tree.reduce`). Any ``p``
and any root: a rank whose partner ``vrank + 2^j`` would be ``p`` or more just has one
child fewer, so a non-power of two needs no folding.

The root reduces into ``recv``, after copying its own vector there; every other rank
reduces into its ``send`` (which is why ``send`` may be overwritten off the root).

Cost for ``n`` bytes: ``⌈lg p⌉(α + nβ + nγ)`` along the root's path (it receives and
reduces the whole vector ``⌈lg p⌉`` times). The fewest latencies: it wins for small
messages; for large ones a reduce-scatter and a gather to the root would send and reduce
about ``n(p-1)/p`` each (not written yet).
"""

import math

from .algorithm import flat_cost, place
from .reduce_call import ReduceAlgorithm
from .registry import register
from .tree import reduce, tree_schedule


@register
class TreeReduce(ReduceAlgorithm):
    """Binomial tree toward the root: the tree allreduce's first phase."""

    name = "tree"

    def workspace(self, size, rank, count, root):
        return tree_schedule(size, rank, count, root).scratch

    def run(self, comm, send, recv, root, reduction):
        count = send.shape[0]
        sched = tree_schedule(comm.Get_size(), comm.Get_rank(), count, root)
        partial = send
        if recv is not None:      # the root: its send is left as it was
            place(recv, send)
            partial = recv
        reduce(comm, partial, sched, reduction.scratch, reduction.reduce, self.tag)

    def cost(self, nbytes, ranks, nodes, params):
        steps = math.ceil(math.log2(ranks))
        return flat_cost(steps, nbytes * steps, nbytes * steps, nodes)
