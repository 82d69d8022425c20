"""Hierarchical (node-aware) allreduce: reduce-scatter in the node, ring between nodes,
allgather in the node — the scheme of NCCL's and Horovod's hierarchical allreduce.

Ranks on one node (``Split_type(COMM_TYPE_SHARED)``) talk through shared memory, and a
node's ranks share one network link. So:

1. the ``k`` ranks of a node reduce-scatter the vector among themselves (ring), each
   ending with the node's sum of one chunk;
2. each rank allreduces its chunk with the ranks that hold the same chunk on the other
   ``N - 1`` nodes (ring, over a sub-communicator per shard);
3. the node's ranks allgather the complete chunks (ring).

A node's link carries ``2n(N-1)/N`` bytes each way instead of the flat ring's
``2n(p-1)/p`` (ranks placed by slot, ``p = N·k``): for 2 nodes of 2 ranks 1.5× fewer.

Uneven nodes: the vector is cut into ``K`` shards, ``K`` the most ranks on any node; a node
of ``k`` ranks gives each rank a contiguous run of ``K/k`` shards (rounded), so every shard
has one owner per node and one sub-communicator joins its owners. A rank with several
shards allreduces them one after the other, in increasing order on every rank, so the
lowest unfinished shard always has all its owners at hand: no deadlock.

Between nodes every message is cut into segments of at most ``segment_bytes`` (default
``$HPCTRAIN_SEGMENT_BYTES``, else 32 KiB, under Open MPI's TCP eager limit): with two
nodes the ring's left and right neighbour are the same rank, and over TCP whole messages
would take turns on the pair's one connection (:mod:`.ring` says why; ``segment_bytes=0``:
whole messages).

Option ``ranks_per_node`` (default: the environment variable ``HPCTRAIN_RANKS_PER_NODE``,
else 0): 0 groups ranks by shared-memory node (``Split_type``); ``k > 0`` puts ranks
``[i·k, (i+1)·k)`` on node ``i``, so that one machine can stand in for several nodes
(tests) or so that a launch whose ranks are placed by slot can say so.

The sub-communicators are made once per private communicator (:meth:`Hierarchical.setup`,
collective: one ``Split`` per shard) and freed with it.
"""

from dataclasses import dataclass
from functools import lru_cache

from .algorithm import Algorithm, chunk_bounds, count_option, flat_cost
from .registry import register
from .ring import (SEGMENT_BYTES, allgather, owned_chunk, reduce_scatter, ring_over,
                   ring_schedule, segment_bytes)
from ..devices import split_by_node

#: Environment variable giving the default ``ranks_per_node``.
RANKS_PER_NODE_ENV = "HPCTRAIN_RANKS_PER_NODE"


@dataclass(frozen=True)
class Layout:
    """Where every rank is: ``nodes[r]`` is the node index of rank ``r``."""

    nodes: tuple

    @property
    def members(self):
        """The ranks of each node, in rank order."""
        groups = {}
        for rank, node in enumerate(self.nodes):
            groups.setdefault(node, []).append(rank)
        return tuple(tuple(groups[node]) for node in sorted(groups))

    @property
    def shards(self):
        """``K``: the most ranks on any node."""
        return max(len(m) for m in self.members)


@dataclass
class NodeGroups:
    """The set-up of one ``ranks_per_node``: the layout and the sub-communicators."""

    layout: Layout
    local: object             # the ranks of this node
    inter: dict               # shard -> the owners of that shard, one per node


@dataclass(frozen=True)
class HierarchicalSchedule:
    """The node-local ring, and the shards this rank allreduces between nodes."""

    local: object             # RingSchedule over the node's ranks, chunks of whole shards
    shards: tuple             # ((shard, lo, hi, RingSchedule between nodes), ...)
    scratch: int


def node_layout(nodes):
    """The :class:`Layout` of ranks whose node identifiers (any comparable) are ``nodes``;
    nodes are numbered in the order of their lowest rank."""
    order = {}
    for node in nodes:
        order.setdefault(node, len(order))
    return Layout(tuple(order[node] for node in nodes))


def first_shards(shards, size):
    """Where each of a node's ``size`` chunks starts, in shards (``size + 1`` offsets)."""
    return tuple(c * shards // size for c in range(size + 1))


def owned_shards(layout, rank):
    """The shards ``rank`` holds complete after the node's reduce-scatter."""
    members = layout.members[layout.nodes[rank]]
    size, local = len(members), members.index(rank)
    starts = first_shards(layout.shards, size)
    chunk = owned_chunk(size, local)
    return range(starts[chunk], starts[chunk + 1])


@lru_cache(maxsize=256)
def hierarchical_schedule(layout, rank, count, segment=0):
    """The schedule of ``rank`` for ``count`` elements on ``layout``, messages between nodes
    cut into ``segment`` elements (0: whole)."""
    node = layout.nodes[rank]
    members, nodes = layout.members[node], len(layout.members)
    bounds = chunk_bounds(count, layout.shards)
    chunks = tuple(bounds[s] for s in first_shards(layout.shards, len(members)))
    local = ring_over(len(members), members.index(rank), chunks)
    shards = tuple((s, bounds[s], bounds[s + 1],
                    ring_schedule(nodes, node, bounds[s + 1] - bounds[s], segment))
                   for s in owned_shards(layout, rank))
    scratch = max([local.scratch, *(sched.scratch for *_, sched in shards)])
    return HierarchicalSchedule(local, shards, scratch)


@register
class Hierarchical(Algorithm):
    """Reduce-scatter in each node, ring allreduce between nodes, allgather in each node."""

    name = "hierarchical"
    options = {"ranks_per_node": None, "segment_bytes": None}
    has_setup = True
    chosen_by_model = True

    def validate(self, size, params):
        per_node = count_option("ranks_per_node", params[0], RANKS_PER_NODE_ENV, 0,
                                "the ranks per node, or 0 for the shared-memory nodes")
        return (min(per_node, size), segment_bytes(params[1], SEGMENT_BYTES))

    def examples(self, size):
        """The real nodes, every split of the ranks into nodes of ``k``, and messages
        between nodes whole or in 1 KiB segments (several per message even when small)."""
        return [{}, *({"ranks_per_node": k} for k in range(1, size + 1)),
                {"ranks_per_node": 1, "segment_bytes": 0},
                {"ranks_per_node": 1, "segment_bytes": 1024}]

    def setup(self, comm, params):
        from mpi4py import MPI

        rank = comm.Get_rank()
        local = split_by_node(comm, params[0])     # freed with the context (communicators)
        # A node is known to the others by its lowest rank, found on the node.
        layout = node_layout(comm.allgather(local.allreduce(rank, op=MPI.MIN)))
        mine = set(owned_shards(layout, rank))
        inter = {}
        # One Split per shard, in the same order on every rank (Split is collective).
        for shard in range(layout.shards):
            sub = comm.Split(shard if shard in mine else MPI.UNDEFINED, layout.nodes[rank])
            if shard in mine:
                inter[shard] = sub
        return NodeGroups(layout, local, inter)

    def setup_key(self, params):
        return params[:1]     # the segment size changes no sub-communicator

    def communicators(self, state):
        return (state.local, *state.inter.values())

    def schedule(self, size, rank, count, itemsize, params, setup=None):
        segment = max(params[1] // itemsize, 1) if params[1] else 0
        return hierarchical_schedule(setup.layout, rank, count, segment)

    def run(self, comm, flat, plan):
        sched, groups, tag = plan.schedule, plan.setup, self.tag
        reduce, scratch = plan.reduce, plan.scratch
        reduce_scatter(groups.local, flat, sched.local, scratch, reduce, tag)
        for shard, lo, hi, ring in sched.shards:
            reduce_scatter(groups.inter[shard], flat[lo:hi], ring, scratch, reduce, tag)
            allgather(groups.inter[shard], flat[lo:hi], ring, tag)
        allgather(groups.local, flat, sched.local, tag)

    def cost(self, nbytes, ranks, nodes, params):
        """Two levels, for ``nodes`` nodes of ``k = p/N`` ranks: the node's ring phases
        ``2(k-1)α + 2n(k-1)/k β + n(k-1)/k γ``; between nodes, each rank's ring on ``n/k``
        bytes, ``2(N-1)α' + (n/k)(N-1)/N γ``, and the node's link carries the ``k`` rings'
        bytes: ``2n(N-1)/N β'``."""
        n, N = nbytes, max(1, min(nodes, ranks))
        k = ranks / N
        local = flat_cost(2 * (k - 1), 2 * n * (k - 1) / k, n * (k - 1) / k, 1)
        if N == 1:
            return local
        between = (0.0, 0.0, (n / k) * (N - 1) / N, 2.0 * (N - 1), 2 * n * (N - 1) / N)
        return tuple(a + b for a, b in zip(local, between))
