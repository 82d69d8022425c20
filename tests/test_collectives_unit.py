"""The allreduce algorithms without MPI: chunking, schedules, validation, registry, reductions.

The schedules are checked by running each algorithm's own ``run`` for 1 to 9 ranks, one
thread per rank, over an in-memory stand-in for the communicator: every message must find a
receive of exactly its size, and every rank must end with the exact sum. This covers rank
counts that the MPI suite (np = 1..4) does not.
"""

import queue
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpctrain.collectives import ALGORITHMS, DTYPES, OPS, Algorithm, available
from hpctrain.collectives import base, butterfly, ps, ring, tree
from hpctrain.errors import UsageError

OURS = ("ring", "tree", "butterfly", "ps", "ps-sharded")


# ----- chunking -------------------------------------------------------------------------------

@given(count=st.integers(0, 10_000), parts=st.integers(1, 64))
def test_chunks_cover_everything_and_differ_by_at_most_one(count, parts):
    bounds = base.chunk_bounds(count, parts)
    sizes = np.diff(bounds)
    assert len(bounds) == parts + 1 and bounds[0] == 0 and bounds[-1] == count
    assert sizes.min() >= 0 and sizes.max() - sizes.min() <= 1
    assert list(sizes) == sorted(sizes, reverse=True)   # the larger chunks come first


def test_chunk_bounds_examples():
    assert base.chunk_bounds(10, 3) == (0, 4, 7, 10)
    assert base.chunk_bounds(2, 4) == (0, 1, 2, 2, 2)
    assert base.chunk_bounds(0, 2) == (0, 0, 0)


# ----- schedules, run by every rank over an in-memory communicator --------------------------

class FakeComm:
    """One rank's view of an in-memory communicator: buffered sends, blocking receives."""

    def __init__(self, rank, size, mailboxes):
        self.rank, self.size, self.mailboxes = rank, size, mailboxes

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
    mailboxes, results, errors = _Mailboxes(), [None] * size, []
    params = algorithm.parameters(size, options)
    info = DTYPES[dtype]

    def rank_main(rank):
        try:
            flat = np.array(base_values(rank, count), dtype=info.transport)
            sched = algorithm.schedule(size, rank, count, info.itemsize, params)
            # A workspace of exactly the size the schedule asks for: too small shows.
            plan = base.Plan(algorithm, info, op, count, params, sched,
                             base.host_reducer(info, op, count),
                             np.empty(sched.scratch, dtype=info.transport), None, None)
            algorithm.run(FakeComm(rank, size, mailboxes), flat, plan)
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


def option_settings(algo, size):
    if algo in ("tree", "ps"):
        return [{"root": r} for r in range(size)]
    if algo == "ps-sharded":
        return [{"servers": k} for k in range(1, size + 1)]
    if algo == "butterfly":
        return [{"switch_bytes": 0}, {"switch_bytes": 1 << 40}]
    return [{}]


@pytest.fixture
def no_mpi_waitall(monkeypatch):
    # ps and ps-sharded wait through MPI.Request.Waitall; here requests are fakes.
    monkeypatch.setattr(ps, "waitall", lambda requests: [r.Wait() for r in requests])


@pytest.mark.parametrize("size", range(2, 10))
@pytest.mark.parametrize("algo", OURS)
def test_every_rank_ends_with_the_exact_sum(algo, size, no_mpi_waitall):
    for count in sorted({1, size - 1, size, size + 1, 2 * size + 3, 37}):
        want = sum(base_values(r, count) for r in range(size))
        for options in option_settings(algo, size):
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


# ----- validation ---------------------------------------------------------------------------

def test_unknown_options_list_the_valid_ones():
    with pytest.raises(UsageError, match="takes no option 'root'; its options: none"):
        ALGORITHMS["ring"].parameters(4, {"root": 0})
    with pytest.raises(UsageError, match="its options: root"):
        ALGORITHMS["tree"].parameters(4, {"servers": 2})


@pytest.mark.parametrize("algo, options, message", [
    ("tree", {"root": 4}, "valid values are 0 to 3"),
    ("ps", {"root": -1}, "valid values are 0 to 3"),
    ("ps-sharded", {"servers": 5}, "valid values are 1 to 4"),
    ("ps-sharded", {"servers": 0}, "valid values are 1 to 4"),
    ("butterfly", {"switch_bytes": -1}, "must be >= 0"),
    ("tree", {"root": 1.5}, "must be an integer"),
    ("tree", {"root": True}, "must be an integer"),
])
def test_option_values_are_checked(algo, options, message):
    with pytest.raises(UsageError, match=message):
        ALGORITHMS[algo].parameters(4, options)


def test_option_defaults():
    assert ALGORITHMS["tree"].parameters(4, {}) == (0,)
    assert ALGORITHMS["ps-sharded"].parameters(4, {}) == (4,)
    assert ALGORITHMS["butterfly"].parameters(4, {}) == (64 * 1024,)
    assert ALGORITHMS["ps"].parameters(3, {"root": np.int64(2)}) == (2,)


def test_non_contiguous_buffers_name_the_fix():
    with pytest.raises(UsageError, match=r"np\.ascontiguousarray"):
        base.flatten(np.ones((4, 4))[:, 0])
    with pytest.raises(UsageError, match=r"\.contiguous\(\)"):
        base.flatten(torch.ones(4, 4).t())


@pytest.mark.parametrize("buf", [np.ones(3, dtype=np.uint8), np.ones(3, dtype=np.complex64),
                                 torch.ones(3, dtype=torch.uint8), np.ones(3, dtype=">f4")])
def test_unsupported_dtypes_list_the_valid_ones(buf):
    with pytest.raises(UsageError, match="valid choices: bfloat16, float16, float32, float64, "
                                         "int32, int64"):
        base.flatten(buf)


def test_other_buffers_are_rejected():
    with pytest.raises(UsageError, match="NumPy array or a torch tensor, got list"):
        base.flatten([1.0, 2.0])
    readonly = np.ones(3)
    readonly.flags.writeable = False
    with pytest.raises(UsageError, match="read-only"):
        base.flatten(readonly)


def test_flatten_is_a_view_and_halves_travel_as_int16():
    array = np.ones((2, 3), dtype=np.float16)
    flat, dtype, device = base.flatten(array)
    assert flat.dtype == np.int16 and flat.shape == (6,) and dtype.name == "float16"
    assert np.shares_memory(flat, array) and device is None
    tensor = torch.ones(2, 2, dtype=torch.bfloat16)
    flat, dtype, _ = base.flatten(tensor)
    assert flat.dtype == np.int16 and dtype.name == "bfloat16"
    flat[0] = 0
    assert tensor[0, 0] == 0


# ----- registry -----------------------------------------------------------------------------

def test_registry_names_every_algorithm_once():
    assert set(ALGORITHMS) == {"ring", "tree", "butterfly", "ps", "ps-sharded", "mpi",
                               "horovod"}
    assert all(isinstance(a, Algorithm) and a.name == name for name, a in ALGORITHMS.items())
    assert set(available()) <= set(ALGORITHMS) and "ring" in available()
    assert set(DTYPES) == {"float16", "bfloat16", "float32", "float64", "int32", "int64"}
    assert set(OPS) == {"sum", "avg", "min", "max"}


def test_algorithms_use_tags_of_their_own():
    tags = [t for name in OURS for t in (ALGORITHMS[name].tag, ALGORITHMS[name].tag + 1)]
    assert len({ALGORITHMS[name].tag for name in OURS}) == len(OURS)
    assert len(set(tags)) >= len(OURS) + 2     # ps and ps-sharded use tag and tag + 1


def test_mismatch_check_codes_are_distinct():
    codes = [base.algorithm_code(name) for name in ALGORITHMS]
    assert len(set(codes)) == len(codes)
    assert len({d.code for d in DTYPES.values()}) == len(DTYPES)


def test_importing_needs_no_mpi():
    import subprocess
    import sys

    code = ("import sys, hpctrain.collectives; "
            "print('mpi4py.MPI' in sys.modules, 'horovod' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.split() == ["False", "False"]


# ----- reductions ---------------------------------------------------------------------------

halves = st.floats(-30000, 30000, width=16)   # sums stay finite
BIG32 = float(np.float32(1e30))     # a bound hypothesis accepts at width 32


@settings(max_examples=200)
@given(a=halves, b=halves)
def test_float16_sums_are_rounded_once_from_float32(a, b):
    dst, src = np.array([a], dtype=np.float16), np.array([b], dtype=np.float16)
    base.host_reducer(DTYPES["float16"], "sum", 1)(dst.view(np.int16), src.view(np.int16))
    assert dst[0] == np.float16(np.float32(a) + np.float32(b))


@settings(max_examples=200)
@given(a=st.floats(-BIG32, BIG32, width=32), b=st.floats(-BIG32, BIG32, width=32))
def test_bfloat16_sums_are_rounded_once_from_float32(a, b):
    x = torch.tensor([a], dtype=torch.bfloat16)
    y = torch.tensor([b], dtype=torch.bfloat16)
    want = (x.float() + y.float()).bfloat16()
    flat_x, flat_y = x.view(torch.int16).numpy(), y.view(torch.int16).numpy()
    base.host_reducer(DTYPES["bfloat16"], "sum", 1)(flat_x, flat_y)
    assert torch.equal(x, want)


@settings(max_examples=200)
@given(values=st.lists(st.floats(-BIG32, BIG32, width=32), min_size=4, max_size=4))
def test_the_few_element_sum_rounds_like_numpy(values):
    for count in (1, 2):
        dst = np.array(values[:count], dtype=np.float32)
        src = np.array(values[2:2 + count], dtype=np.float32)
        want = dst + src
        base.host_reducer(DTYPES["float32"], "sum", count)(dst, src)
        assert np.array_equal(dst, want)


@pytest.mark.parametrize("op, want", [("sum", [3, -1]), ("min", [1, -3]), ("max", [2, 2])])
def test_host_reducers(op, want):
    dst, src = np.array([1, -3]), np.array([2, 2])
    base.host_reducer(DTYPES["int64"], op, 2)(dst, src)
    assert dst.tolist() == want


def test_integer_average_is_floor_division():
    flat = np.array([-3, 3, 4], dtype=np.int32)
    base.averager(DTYPES["int32"], 2, on_device=False)(flat)
    assert flat.tolist() == [-2, 1, 2]
    halves = torch.tensor([3.0, -1.0], dtype=torch.bfloat16)
    base.averager(DTYPES["bfloat16"], 2, on_device=False)(halves.view(torch.int16).numpy())
    assert halves.tolist() == [1.5, -0.5]
