"""Every algorithm's schedule, run without MPI, for 1 to 9 ranks.

Each rank is a thread running the algorithm's own ``setup``, ``schedule`` and ``run`` over an
in-memory stand-in for the communicator (point-to-point messages, ``Split``,
``Split_type``, ``allgather``): every message must find a receive of exactly its size, and
every rank must end with the exact sum. This covers rank counts and node layouts that the
MPI suite (np = 1..4) does not.
"""

import queue
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from hpctrain.collectives import ALGORITHMS, DTYPES, Algorithm, butterfly, hierarchical, ps
from hpctrain.collectives import ring, tree
from hpctrain.collectives.contexts import Plan
from hpctrain.collectives.reduce import host_reducer

#: The algorithms that move the data themselves (a schedule of their own), by the registry.
OURS = sorted(name for name, a in ALGORITHMS.items()
              if type(a).schedule is not Algorithm.schedule)


class Shared:
    """What the ranks of one in-memory communicator share."""

    def __init__(self, size):
        self.mailboxes = _Mailboxes()
        self.barrier = threading.Barrier(size, timeout=10)
        self.slots = [None] * size
        self.children = {}      # (split number, color) -> Shared


class FakeComm:
    """One rank's view of an in-memory communicator: buffered sends, blocking receives,
    and the few collectives that set-ups use."""

    def __init__(self, rank, size, shared):
        self.rank, self.size, self.shared = rank, size, shared
        self.mailboxes, self.splits = shared.mailboxes, 0

    def exchange(self, value):
        """Every rank's ``value``, in rank order (an allgather through shared memory)."""
        self.shared.slots[self.rank] = value
        self.shared.barrier.wait()
        values = list(self.shared.slots)
        self.shared.barrier.wait()     # nobody overwrites a slot before all have read it
        return values

    def allgather(self, value):
        return self.exchange(value)

    def allreduce(self, value, op):
        assert op is MPI.MIN, op
        return min(self.exchange(value))

    def Split(self, color, key=0):
        entries = self.exchange((color, key))
        number, self.splits = self.splits, self.splits + 1
        if color == MPI.UNDEFINED:
            return None
        members = sorted((k, r) for r, (c, k) in enumerate(entries) if c == color)
        shared = self.shared.children.setdefault((number, color), Shared(len(members)))
        return FakeComm(members.index((key, self.rank)), len(members), shared)

    def Split_type(self, split_type, key=0):
        return self.Split(0, key)    # one machine: one node

    def Free(self):
        pass

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Send(self, buf, dest, tag):
        self.mailboxes[(self.rank, dest, tag)].put(np.array(buf, copy=True))

    def Recv(self, buf, source, tag):
        message = self.mailboxes[(source, self.rank, tag)].get(timeout=10)
        if message.shape != buf.shape:
            raise AssertionError(f"rank {self.rank}: {message.shape[0]} elements from "
                                 f"{source} into a buffer of {buf.shape[0]}")
        buf[...] = message

    def Sendrecv(self, sendbuf, dest, sendtag, recvbuf, source, recvtag):
        self.Send(sendbuf, dest, sendtag)
        self.Recv(recvbuf, source, recvtag)

    def Isend(self, buf, dest, tag):
        self.Send(buf, dest, tag)
        return _Done()

    def Irecv(self, buf, source, tag):
        return _Pending(lambda: self.Recv(buf, source, tag))


class _Done:
    def Wait(self):
        pass


class _Pending:
    def __init__(self, receive):
        self.receive = receive

    def Wait(self):
        self.receive()


class _Mailboxes(dict):
    def __missing__(self, key):
        # setdefault, not ``self[key] = ...``: two ranks' threads may miss the same key at
        # once, and the one that stored its queue last would strand the other's message.
        return self.setdefault(key, queue.Queue())


def simulate(algo, size, count, options, dtype="int64", op="sum"):
    """Run ``algo`` on ``size`` threads; every rank's result, or the first error raised."""
    algorithm = ALGORITHMS[algo]
    shared, results, errors = Shared(size), [None] * size, []
    params = algorithm.parameters(size, options)
    info = DTYPES[dtype]

    def rank_main(rank):
        try:
            flat = np.array(base_values(rank, count), dtype=info.transport)
            comm = FakeComm(rank, size, shared)
            setup = algorithm.setup(comm, params) if algorithm.has_setup else None
            sched = algorithm.schedule(size, rank, count, info.itemsize, params, setup)
            # A workspace of exactly the size the schedule asks for: too small shows.
            plan = Plan(algorithm, info, op, count, params, sched,
                        host_reducer(info, op, count),
                        np.empty(sched.scratch, dtype=info.transport), None, None,
                        setup=setup)
            algorithm.run(comm, flat, plan)
            results[rank] = flat
        except Exception as exc:   # reported by the main thread
            errors.append(f"rank {rank}: {exc!r}")

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a rank is stuck waiting for a message"
    return results


def base_values(rank, count):
    return (np.arange(count) * 5 + rank * 3) % 11 - 5


@pytest.fixture
def no_mpi_waitall(monkeypatch):
    # ps and ps-sharded wait through MPI.Request.Waitall; here requests are fakes.
    for module in (ps, hierarchical):
        monkeypatch.setattr(module, "waitall", lambda requests: [r.Wait() for r in requests])


@pytest.mark.parametrize("size", range(2, 10))
@pytest.mark.parametrize("algo", OURS)
def test_every_rank_ends_with_the_exact_sum(algo, size, no_mpi_waitall):
    for count in sorted({1, size - 1, size, size + 1, 2 * size + 3, 37}):
        want = sum(base_values(r, count) for r in range(size))
        for options in ALGORITHMS[algo].examples(size):
            results = simulate(algo, size, count, options)
            for rank, got in enumerate(results):
                assert np.array_equal(got, want), (algo, size, count, options, rank)


def test_ring_sends_right_and_receives_left():
    sched = ring.ring_schedule(4, 1, 10)
    assert (sched.right, sched.left) == (2, 0)
    assert len(sched.reduce_scatter) == len(sched.allgather) == 3
    # Step 0: send my own chunk (1: elements 3..6), receive the left neighbour's (0: 0..3).
    assert sched.reduce_scatter[0] == (3, 6, 0, 3)


@pytest.mark.parametrize("size", range(1, 10))
def test_binomial_tree_shape(size):
    for root in range(size):
        parents = {r: tree.tree_schedule(size, r, 8, root).parent for r in range(size)}
        assert parents[root] is None
        assert sum(p is None for p in parents.values()) == 1
        for rank in range(size):
            for child in tree.tree_schedule(size, rank, 8, root).children:
                assert parents[child] == rank
        # ceil(lg p) rounds: the root receives once per round, and no path is longer.
        rounds = (size - 1).bit_length()
        assert len(tree.tree_schedule(size, root, 8, root).children) == rounds
        assert max(_depth(parents, r) for r in range(size)) <= rounds


def _depth(parents, rank):
    return 0 if parents[rank] is None else 1 + _depth(parents, parents[rank])


def test_butterfly_folds_the_extra_ranks_like_mpich():
    # p = 6: p' = 4, r = 2 extra ranks; ranks 0 and 2 fold into 1 and 3.
    roles = [butterfly.butterfly_schedule(6, r, 100, False) for r in range(6)]
    assert [s.fold for s in roles] == ["out", "in", "out", "in", "", ""]
    assert [s.partner for s in roles[:4]] == [1, 0, 3, 2]
    assert all(len(s.steps) == 2 for s in roles if s.fold != "out")   # lg p' steps


def test_butterfly_switches_at_switch_bytes():
    bfly = ALGORITHMS["butterfly"]
    assert not bfly.schedule(4, 0, 1000, 4, (65536,)).halving
    assert bfly.schedule(4, 0, 16384, 4, (65536,)).halving
    assert bfly.schedule(4, 0, 1, 8, (0,)).halving


def test_ring_and_rabenseifner_move_the_bandwidth_optimal_amount():
    # Each rank sends 2n(p-1)/p elements (the lower bound) when p is a power of two.
    size, count = 8, 8000
    sched = ring.ring_schedule(size, 3, count)
    sent = sum(hi - lo for lo, hi, _, _ in sched.reduce_scatter + sched.allgather)
    halving = butterfly.butterfly_schedule(size, 3, count, True)
    sent_b = 2 * sum(s_hi - s_lo for _, s_lo, s_hi, _, _ in halving.steps)
    assert sent == sent_b == 2 * count * (size - 1) // size




# ----- hierarchical: layouts, uneven nodes, bytes on the node links ---------------------------

@settings(max_examples=100, deadline=None)
@given(nodes=st.lists(st.integers(0, 4), min_size=1, max_size=12))
def test_every_shard_has_exactly_one_owner_on_every_node(nodes):
    layout = hierarchical.node_layout(nodes)
    for members in layout.members:
        owned = [s for rank in members for s in hierarchical.owned_shards(layout, rank)]
        assert sorted(owned) == list(range(layout.shards))


def test_nodes_are_numbered_by_their_lowest_rank():
    layout = hierarchical.node_layout(["b", "a", "b", "c"])
    assert layout.nodes == (0, 1, 0, 2)
    assert layout.members == ((0, 2), (1,), (3,)) and layout.shards == 2


@settings(max_examples=30, deadline=None)
@given(size=st.integers(2, 7), per_node=st.integers(1, 7), count=st.integers(0, 60),
       segment=st.integers(0, 5))
def test_hierarchical_sums_exactly_on_any_split_into_nodes(size, per_node, count, segment):
    want = sum(base_values(r, count) for r in range(size))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hierarchical, "waitall", lambda requests: [r.Wait() for r in requests])
        results = simulate("hierarchical", size, count,
                           {"ranks_per_node": per_node, "segment_bytes": 8 * segment})
    for rank, got in enumerate(results):
        assert np.array_equal(got, want), (size, per_node, count, segment, rank)


def node_link_bytes(nodes, per_node, count, itemsize=4):
    """Bytes each node sends to other nodes in one hierarchical allreduce (from schedules)."""
    size = nodes * per_node
    layout = hierarchical.node_layout([r // per_node for r in range(size)])
    sent = [0] * nodes
    for rank in range(size):
        sched = hierarchical.hierarchical_schedule(layout, rank, count)
        for *_, between in sched.shards:
            steps = between.reduce_scatter + between.allgather
            sent[layout.nodes[rank]] += sum(hi - lo for lo, hi, _, _ in steps) * itemsize
    return sent


@pytest.mark.parametrize("nodes, per_node", [(2, 2), (4, 2), (3, 4), (8, 8)])
def test_a_node_link_carries_what_the_cost_model_says(nodes, per_node):
    count = 4 * 1024 * nodes * per_node
    n = count * 4
    p = nodes * per_node
    for sent in node_link_bytes(nodes, per_node, count):
        assert sent == 2 * n * (nodes - 1) // nodes   # the flat ring: 2n(p-1)/p
    cost = ALGORITHMS["hierarchical"].cost(float(n), p, nodes, (per_node,))
    assert cost[4] == pytest.approx(2 * n * (nodes - 1) / nodes)
    assert ALGORITHMS["ring"].cost(float(n), p, nodes, ())[4] == \
        pytest.approx(2 * n * (p - 1) / p)
