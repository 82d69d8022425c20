"""Binomial-tree allreduce: a reduce to a root, then a broadcast from it.

Ranks are numbered relative to the root (``vrank = (rank - root) mod p``). In the reduce,
step ``k`` (mask ``2^k``) has every rank whose ``vrank`` has bit ``k`` set send its partial
sum to ``vrank - 2^k`` and drop out; after ``ceil(lg p)`` steps the root holds the total.
The broadcast runs the same tree backwards. Each half is one function, which is also the
whole of a collective: :func:`reduce` of the tree reduce (:mod:`.reduce_tree`),
:func:`broadcast` of the tree broadcast (:mod:`.broadcast_tree`).

Cost: ``2⌈lg p⌉α + 2n⌈lg p⌉β + n⌈lg p⌉γ``. Few latencies, but the whole vector crosses
every level twice and the ranks near the root do the most work: it suits small messages
and cases where the result is wanted at one root first (``root=`` option, default 0).
On several nodes only the rounds in which some pair sits on two nodes go over the links
between nodes (:func:`rounds_across_nodes`): with ``k`` ranks per node placed by slot and
``k`` a power of two, the first ``lg k`` rounds stay inside the nodes.
"""

import math
from dataclasses import dataclass
from functools import lru_cache

from .algorithm import RootedAlgorithm
from .registry import register


@dataclass(frozen=True)
class TreeSchedule:
    """This rank's place in the binomial tree."""

    parent: object            # rank, or None at the root
    children: tuple           # ranks, in the order their partial sums arrive
    scratch: int


@lru_cache(maxsize=256)
def tree_schedule(size, rank, count, root):
    """The binomial tree of ``size`` ranks rooted at ``root``, seen from ``rank``."""
    vrank = (rank - root) % size
    parent, children, mask = None, [], 1
    while mask < size:
        if vrank & mask:
            parent = (vrank - mask + root) % size
            break
        if vrank + mask < size:
            children.append((vrank + mask + root) % size)
        mask <<= 1
    return TreeSchedule(parent, tuple(children), count if children else 0)


@lru_cache(maxsize=1024)
def rounds_across_nodes(size, nodes, root=0):
    """How many of the tree's ``⌈lg p⌉`` rounds have a pair of ranks on two nodes, for
    ``size`` ranks placed by slot on ``nodes`` nodes (rank ``r`` on node ``r·N // p``):
    the rounds whose time is the link's between nodes."""
    node = [((v + root) % size) * nodes // size for v in range(size)]
    across, mask = 0, 1
    while mask < size:
        across += any(node[v] != node[v + mask] for v in range(0, size - mask, 2 * mask))
        mask <<= 1
    return across


def reduce(comm, flat, sched, scratch, kernel, tag):
    """The tree's reduce of ``flat`` toward its root over ``comm``: each child's partial
    result received into ``scratch`` (at least ``len(flat)`` elements) and reduced into
    ``flat`` with ``kernel(dst, src)``, then ``flat`` sent to the parent (the tree
    allreduce's first half, and the whole tree reduce). At the root ``flat`` ends holding
    the total."""
    if sched.children:
        scratch = scratch[:flat.shape[0]]
        # Children in the order of their subtrees' sizes, smallest first: the order they
        # finish. A child's send waits for nothing but its own subtree, so these blocking
        # calls cannot deadlock, even where MPI makes every send synchronous.
        for child in sched.children:
            comm.Recv(scratch, child, tag)
            kernel(flat, scratch)
    if sched.parent is not None:
        comm.Send(flat, sched.parent, tag)


def broadcast(comm, flat, sched, tag):
    """The tree's broadcast of ``flat`` from its root over ``comm``: from the parent, then
    to every child (the tree allreduce's second half, and the whole tree broadcast)."""
    if sched.parent is not None:
        comm.Recv(flat, sched.parent, tag)
    # The largest subtree first: it has the most levels still to go. A child's next call
    # here is its receive from this rank, so these blocking sends cannot deadlock.
    for child in reversed(sched.children):
        comm.Send(flat, child, tag)


@register
class Tree(RootedAlgorithm):
    """Binomial-tree reduce to ``root`` then binomial-tree broadcast."""

    name = "tree"
    chosen_by_model = True

    def schedule(self, size, rank, count, itemsize, params, setup=None):
        return tree_schedule(size, rank, count, params[0])

    def run(self, comm, flat, plan):
        sched, tag = plan.schedule, self.tag
        reduce(comm, flat, sched, plan.scratch, plan.reduce, tag)
        broadcast(comm, flat, sched, tag)

    def cost(self, nbytes, ranks, nodes, params):
        """Each round sends the whole vector up (reduce) and down (broadcast): the rounds
        inside the nodes on α, β, the rounds across them on α', β'."""
        steps = math.ceil(math.log2(ranks))
        across = rounds_across_nodes(ranks, max(1, min(nodes, ranks)), params[0] % ranks)
        inside = steps - across
        return (2.0 * inside, 2.0 * nbytes * inside, float(nbytes * steps), 2.0 * across,
                2.0 * nbytes * across)
