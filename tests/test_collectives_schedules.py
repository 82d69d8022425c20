"""Every algorithm's schedule, run without MPI, for 1 to 9 ranks.

Each rank is a thread running the algorithm's own ``setup``, ``schedule`` and ``run`` over an
in-memory stand-in for the communicator (tests/fake_comm.py): every message must find a
receive of exactly its size, every rank must end with the exact sum, and no rank may wait
forever. Each schedule runs twice: with every send buffered, and with every send
synchronous (a send completes only once its receive is posted, as MPI may do for any
message above its eager limit), where a schedule that only works because MPI buffers small
messages deadlocks, and the fake reports on what each rank waited. This covers rank counts
and node layouts that the MPI suite (np = 1..4) does not.
"""

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_comm import BUFFERED, Deadlock, run_ranks, waitall
from hpctrain.collectives import ALGORITHMS, DTYPES, Algorithm, algorithm, butterfly
from hpctrain.collectives import hierarchical, ring, tree
from hpctrain.collectives.plans import Plan
from hpctrain.collectives.kernels import host_reducer

#: The algorithms that move the data themselves (a schedule of their own), by the registry.
OURS = sorted(name for name, a in ALGORITHMS.items()
              if type(a).schedule is not Algorithm.schedule)
#: Eager limits: 0, every send synchronous (the strictest MPI allows); BUFFERED, none is.
EAGER = [pytest.param(0, id="sync"), pytest.param(BUFFERED, id="buffered")]


def test_the_registry_finds_every_algorithm_with_a_schedule():
    # The ones handing the buffer to a library (mpi, horovod) have no schedule to run here.
    assert {"ring", "tree", "butterfly", "ps", "ps-sharded", "hierarchical"} <= set(OURS)


def simulate(algo, size, count, options, eager, dtype="int64", op="sum", bound=False):
    """Run ``algo`` on ``size`` threads; every rank's result. Raises the first rank's
    error, or :class:`Deadlock`. ``bound``: through the algorithm's ``bind`` and
    ``bind_buffer``, the data phase the driver runs on a host buffer, instead of ``run``."""
    algo_ = ALGORITHMS[algo]
    params = algo_.parameters(size, options)
    info = DTYPES[dtype]

    def rank_main(comm):
        flat = np.array(base_values(comm.Get_rank(), count), dtype=info.transport)
        setup = algo_.setup(comm, params) if algo_.has_setup else None
        sched = algo_.schedule(size, comm.Get_rank(), count, info.itemsize, params, setup)
        # A workspace of exactly the size the schedule asks for: too small shows.
        plan = Plan(algo_, info, op, count, params, sched, host_reducer(info, op, count),
                    np.empty(sched.scratch, dtype=info.transport), None, None, setup=setup)
        if bound:
            algo_.bind_buffer(comm, plan, flat, algo_.bind(comm, plan))()
        else:
            algo_.run(comm, flat, plan)
        return flat

    with pytest.MonkeyPatch.context() as patch:
        # Algorithms wait through MPI.Request.Waitall (algorithm.waitall); here requests
        # are the fake's.
        for module in {sys.modules[type(a).__module__] for a in ALGORITHMS.values()}:
            if getattr(module, "waitall", None) is algorithm.waitall:
                patch.setattr(module, "waitall", waitall)
        return run_ranks(size, rank_main, eager)


def base_values(rank, count):
    return (np.arange(count) * 5 + rank * 3) % 11 - 5


def ways_to_run(algo):
    """``(dtype, bound)`` pairs: ``run``, and the bound data phase where the algorithm has
    one of its own (in float64, whose one- and two-element sums take a path of their own)."""
    cls = type(ALGORITHMS[algo])
    own = cls.bind is not Algorithm.bind or cls.bind_buffer is not Algorithm.bind_buffer
    return [("int64", False), *([("float64", True)] if own else [])]


@pytest.mark.parametrize("eager", EAGER)
@pytest.mark.parametrize("size", range(2, 10))
@pytest.mark.parametrize("algo", OURS)
def test_every_rank_ends_with_the_exact_sum(algo, size, eager):
    for count in sorted({1, 2, size - 1, size, size + 1, 2 * size + 3, 37}):
        want = sum(base_values(r, count) for r in range(size))
        for options in ALGORITHMS[algo].examples(size):
            for dtype, bound in ways_to_run(algo):
                results = simulate(algo, size, count, options, eager, dtype, bound=bound)
                for rank, got in enumerate(results):
                    assert np.array_equal(got, want), (algo, size, count, options, rank)


def test_a_ring_that_sends_before_it_receives_deadlocks_only_when_sends_are_synchronous(
        monkeypatch):
    # The ring's reduce-scatter with the Sendrecv split into Send then Recv: fine while MPI
    # buffers the chunks, a deadlock once they pass the eager limit.
    def send_then_recv(comm, flat, sched, scratch, reduce, tag):
        for send_lo, send_hi, recv_lo, recv_hi in sched.reduce_scatter:
            comm.Send(flat[send_lo:send_hi], sched.right, tag)
            comm.Recv(scratch[:recv_hi - recv_lo], sched.left, tag)
            reduce(flat[recv_lo:recv_hi], scratch[:recv_hi - recv_lo])

    monkeypatch.setattr(ring, "reduce_scatter", send_then_recv)
    want = sum(base_values(r, 37) for r in range(3))
    assert all(np.array_equal(got, want) for got in simulate("ring", 3, 37, {}, BUFFERED))
    with pytest.raises(Deadlock) as found:
        simulate("ring", 3, 37, {}, eager=0)
    # 37 elements in chunks of 13, 12, 12: each rank is stuck sending its own chunk right.
    for rank, nbytes in enumerate((104, 96, 96)):
        assert (f"rank {rank}: waits in Send of {nbytes} B to rank {(rank + 1) % 3}, tag "
                f"{ALGORITHMS['ring'].tag} (synchronous)") in str(found.value), found.value


@pytest.mark.parametrize("size, apart, segment", [(2, True, ring.SEGMENT_BYTES // 8),
                                                   (2, False, 0), (3, True, 0)])
def test_the_ring_cuts_messages_by_default_only_for_two_ranks_on_two_nodes(
        monkeypatch, size, apart, segment):
    # Two ranks: left and right neighbour are one rank, the TCP trap; three: one direction
    # per connection. ``apart`` puts every rank on a node of its own.
    from fake_comm import FakeComm

    if apart:
        monkeypatch.setattr(FakeComm, "Split_type",
                            lambda self, kind, key=0: self.Split(self.Get_rank(), key))
    algo = ALGORITHMS["ring"]
    params = algo.parameters(size, {})

    def rank_main(comm):
        setup = algo.setup(comm, params)
        return algo.schedule(size, comm.Get_rank(), 10**6, 8, params, setup).segment

    assert run_ranks(size, rank_main, BUFFERED) == [segment] * size
    # Whatever the placement, an explicit option wins.
    explicit = algo.parameters(size, {"segment_bytes": 0})
    assert run_ranks(size, lambda comm: algo.setup(comm, explicit), BUFFERED) == [0] * size


def test_a_ring_of_two_in_segments_sends_each_step_in_eager_sized_pieces(monkeypatch):
    sent = []
    from fake_comm import FakeComm

    isend = FakeComm.Isend

    def counted(self, buf, dest, tag=0):
        sent.append(len(buf))
        return isend(self, buf, dest, tag)

    monkeypatch.setattr(FakeComm, "Isend", counted)
    count = 1000                    # 500 elements a chunk, 8 bytes each, 1 KiB segments
    want = sum(base_values(r, count) for r in range(2))
    results = simulate("ring", 2, count, {"segment_bytes": 1024}, eager=0)
    assert all(np.array_equal(got, want) for got in results)
    # Per rank: 2 steps of 500 elements, each 128 + 128 + 128 + 116 elements.
    assert sorted(sent) == sorted([128, 128, 128, 116] * 2 * 2)


def test_ring_segment_bytes_must_not_be_negative():
    from hpctrain.errors import UsageError

    with pytest.raises(UsageError, match="segment_bytes=-1 must be >= 0"):
        ALGORITHMS["ring"].parameters(2, {"segment_bytes": -1})


def test_the_environment_sets_segment_bytes_where_a_call_does_not(monkeypatch):
    from hpctrain.errors import UsageError

    ring_, hier = ALGORITHMS["ring"], ALGORITHMS["hierarchical"]
    monkeypatch.delenv(ring.SEGMENT_ENV, raising=False)
    assert ring_.parameters(2, {}) == (None,)               # unset: the ring decides
    assert hier.parameters(2, {"ranks_per_node": 1})[1] == ring.SEGMENT_BYTES
    monkeypatch.setenv(ring.SEGMENT_ENV, "0")                # e.g. on an RDMA network
    assert ring_.parameters(2, {}) == (0,)
    assert hier.parameters(2, {"ranks_per_node": 1})[1] == 0
    assert ring_.parameters(2, {"segment_bytes": 4096}) == (4096,)    # the call wins
    for text, message in (("big", "HPCTRAIN_SEGMENT_BYTES='big' is not an integer"),
                          ("-8", "HPCTRAIN_SEGMENT_BYTES=-8 must be >= 0")):
        monkeypatch.setenv(ring.SEGMENT_ENV, text)
        for algo in (ring_, hier):
            with pytest.raises(UsageError, match=message):
                algo.parameters(2, {})


# ----- the fake itself: it must catch what it is there to catch -------------------------------

def swap_by_send_then_recv(comm, nbytes=800, post=None):
    """The classic unsafe exchange: both ranks Send before they Recv."""
    peer = 1 - comm.Get_rank()
    mine = np.full(nbytes, comm.Get_rank(), dtype=np.uint8)
    theirs = np.empty(nbytes, dtype=np.uint8)
    if post == "isend":
        comm.Isend(mine, peer, 5).Wait()
    else:
        comm.Send(mine, peer, 5)
    comm.Recv(theirs, peer, 5)
    return theirs


def test_send_before_recv_deadlocks_above_the_eager_limit():
    with pytest.raises(Deadlock) as found:
        run_ranks(2, swap_by_send_then_recv, eager=799)
    report = str(found.value)
    assert "deadlock with eager limit 799 B" in report, report
    assert "rank 0: waits in Send of 800 B to rank 1, tag 5 (synchronous)" in report, report
    assert "rank 1: waits in Send of 800 B to rank 0, tag 5 (synchronous)" in report, report


@pytest.mark.parametrize("eager", [800, BUFFERED])
def test_send_before_recv_completes_when_the_message_is_eager(eager):
    got = run_ranks(2, swap_by_send_then_recv, eager=eager)
    assert [set(g.tolist()) for g in got] == [{1}, {0}]


def test_eager_limit_zero_makes_even_an_empty_send_synchronous():
    with pytest.raises(Deadlock):
        run_ranks(2, lambda comm: swap_by_send_then_recv(comm, nbytes=0), eager=0)


def test_an_isend_is_waited_for_like_a_send():
    with pytest.raises(Deadlock, match=r"rank 1: waits in Send of 800 B to rank 0"):
        run_ranks(2, lambda comm: swap_by_send_then_recv(comm, post="isend"), eager=0)


def test_sendrecv_swaps_without_deadlock_when_every_send_is_synchronous():
    def swap(comm):
        peer, theirs = 1 - comm.Get_rank(), np.empty(1000, dtype=np.uint8)
        comm.Sendrecv(np.full(1000, comm.Get_rank(), dtype=np.uint8), peer, 5, theirs, peer, 5)
        return theirs

    assert [set(g.tolist()) for g in run_ranks(2, swap, eager=0)] == [{1}, {0}]


def test_a_deadlock_across_a_collective_and_a_split_names_every_rank():
    # Rank 0 waits in a collective of the world, ranks 1 and 2 for each other on a split.
    def main(comm):
        sub = comm.Split(0 if comm.Get_rank() else 1, comm.Get_rank())
        if comm.Get_rank() == 0:
            comm.allgather(0)
        else:
            sub.Send(np.zeros(8), 1 - sub.Get_rank(), 3)

    with pytest.raises(Deadlock) as found:
        run_ranks(3, main, eager=0)
    report = str(found.value)
    assert "rank 0: waits in collective #1 on world" in report, report
    assert ("rank 1: waits in Send of 64 B to rank 1 of world/split0:0 (world rank 2)"
            in report), report
    assert ("rank 2: waits in Send of 64 B to rank 0 of world/split0:0 (world rank 1)"
            in report), report


def test_a_failing_rank_is_reported_not_the_waits_it_leaves_behind():
    def main(comm):
        if comm.Get_rank() == 1:
            raise ValueError("rank 1 broke")
        comm.Recv(np.empty(4), 1, 0)

    with pytest.raises(AssertionError, match=r"rank 1 of 2: ValueError\('rank 1 broke'\)"):
        run_ranks(2, main, eager=BUFFERED)


def test_a_message_of_the_wrong_size_fails_the_receive():
    def main(comm):
        if comm.Get_rank() == 0:
            comm.Send(np.zeros(3), 1, 0)
        else:
            comm.Recv(np.empty(4), 0, 0)

    with pytest.raises(AssertionError, match="Recv of 32 B from rank 0, tag 0: the message "
                                             "has 24 B"):
        run_ranks(2, main, eager=BUFFERED)


def test_messages_of_one_channel_arrive_in_the_order_sent():
    def main(comm):
        got = [np.full(1, -1) for _ in range(5)]
        for value, buf in enumerate(got):
            if comm.Get_rank() == 0:
                comm.Send(np.full(1, value), 1, 0)
            else:
                comm.Recv(buf, 0, 0)
        return [int(buf[0]) for buf in got]

    assert run_ranks(2, main, eager=BUFFERED)[1] == [0, 1, 2, 3, 4]


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
       segment=st.integers(0, 5), eager=st.sampled_from([0, BUFFERED]))
def test_hierarchical_sums_exactly_on_any_split_into_nodes(size, per_node, count, segment,
                                                           eager):
    want = sum(base_values(r, count) for r in range(size))
    results = simulate("hierarchical", size, count,
                       {"ranks_per_node": per_node, "segment_bytes": 8 * segment}, eager)
    for rank, got in enumerate(results):
        assert np.array_equal(got, want), (size, per_node, count, segment, eager, rank)


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
