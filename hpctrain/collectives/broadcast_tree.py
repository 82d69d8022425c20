"""Binomial-tree broadcast: ``⌈lg p⌉`` rounds, the ranks that hold the vector doubling in each.

Ranks are numbered relative to the root (``vrank = (rank - root) mod p``) on the tree
allreduce's tree (:func:`.tree.tree_schedule`): a rank receives the whole vector from its
parent, ``vrank`` less its lowest set bit, then sends it to its children ``vrank + 2^k``
for each ``2^k`` below that bit, the largest subtree first. These steps are the tree
allreduce's broadcast phase: the same function (:func:`.tree.broadcast`).

Cost for ``n`` bytes: ``⌈lg p⌉α + n⌈lg p⌉β`` along the root's path (it sends the whole
vector ``⌈lg p⌉`` times). The fewest latencies: wins for small messages; for large ones
scatter + allgather (:mod:`.broadcast_scatter_allgather`) sends ``2n(p-1)/p`` instead.
"""

import math

from .algorithm import flat_cost
from .broadcast_call import BroadcastAlgorithm
from .registry import register
from .tree import broadcast, tree_schedule


@register
class TreeBroadcast(BroadcastAlgorithm):
    """Binomial tree from the root: the tree allreduce's second phase."""

    name = "tree"

    def run(self, comm, buf, root):
        sched = tree_schedule(comm.Get_size(), comm.Get_rank(), 0, root)
        broadcast(comm, buf, sched, self.tag)

    def cost(self, nbytes, ranks, nodes, params):
        steps = math.ceil(math.log2(ranks))
        return flat_cost(steps, nbytes * steps, 0, nodes)
