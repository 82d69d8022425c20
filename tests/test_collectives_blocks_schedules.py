"""The allgather, reduce-scatter, alltoall, broadcast and reduce algorithms, run without MPI
on 1 to 9 ranks.

Each rank is a thread running the algorithm's own ``run`` over the in-memory communicator of
tests/fake_comm.py (every receive must match its message's size exactly), once with every
send buffered and once with every send synchronous, where an ordering that relies on MPI
buffering deadlocks and is reported. This covers the non-powers of two 5, 6, 7 and 9 and
the uneven blocks that the MPI suite (np = 1..4) cannot reach; broadcast and reduce from
every root.
"""

import numpy as np
import pytest

from fake_comm import BUFFERED, Deadlock, run_ranks
from hpctrain.collectives import DTYPES, REGISTRIES, algorithm
from hpctrain.collectives.broadcast_scatter_allgather import scatter_allgather_schedule
from hpctrain.collectives.kernels import host_reducer

EAGER = [pytest.param(0, id="sync"), pytest.param(BUFFERED, id="buffered")]


def ours(collective):
    """The algorithms of ``collective`` that move the data themselves (not the library's)."""
    return sorted(name for name in REGISTRIES[collective] if name != "mpi")


def count_patterns(size):
    """Per-rank block sizes: empty, one each, fewer than ranks, uneven with zeros, prime."""
    return [[0] * size, [1] * size, [1] * (size - 1) + [0],
            [(5 * r + 3) % 7 for r in range(size)], [13] * size]


def bounds_of(counts):
    return tuple(int(b) for b in np.concatenate([[0], np.cumsum(counts)]))


def values(rank, count, salt=0):
    return (np.arange(count) * 5 + rank * 3 + salt) % 11 - 5


@pytest.mark.parametrize("eager", EAGER)
@pytest.mark.parametrize("size", range(1, 10))
@pytest.mark.parametrize("algo", ours("allgather"))
def test_allgather_gives_every_rank_every_block(algo, size, eager):
    algo_ = REGISTRIES["allgather"][algo]
    for counts in count_patterns(size):
        bounds = bounds_of(counts)

        def rank_main(comm):
            rank = comm.Get_rank()
            recv = np.full(bounds[-1], -99, dtype=np.int64)
            algo_.run(comm, values(rank, counts[rank]), recv, bounds)
            return recv

        want = np.concatenate([values(r, counts[r]) for r in range(size)])
        for rank, got in enumerate(run_ranks(size, rank_main, eager)):
            assert np.array_equal(got, want), (algo, size, counts, rank)


@pytest.mark.parametrize("eager", EAGER)
@pytest.mark.parametrize("size", range(1, 10))
@pytest.mark.parametrize("algo", ours("reducescatter"))
def test_reduce_scatter_gives_every_rank_its_block_of_the_sum(algo, size, eager):
    algo_ = REGISTRIES["reducescatter"][algo]
    int64 = DTYPES["int64"]
    for counts in count_patterns(size):
        bounds = bounds_of(counts)

        def rank_main(comm):
            rank = comm.Get_rank()
            send = values(rank, bounds[-1])
            recv = np.full(counts[rank], -99, dtype=np.int64)
            # A workspace of exactly the size the algorithm asks for: too small shows.
            scratch = np.empty(algo_.workspace(size, rank, bounds), dtype=np.int64)
            reduction = algorithm.Reduction(int64, "sum", host_reducer(int64, "sum", 0),
                                            scratch)
            algo_.run(comm, send, recv, bounds, reduction)
            return recv

        total = sum(values(r, bounds[-1]) for r in range(size))
        for rank, got in enumerate(run_ranks(size, rank_main, eager)):
            assert np.array_equal(got, total[bounds[rank]:bounds[rank + 1]]), \
                (algo, size, counts, rank)


@pytest.mark.parametrize("eager", EAGER)
@pytest.mark.parametrize("size", range(1, 10))
@pytest.mark.parametrize("algo", ours("alltoall"))
def test_alltoall_delivers_every_block_to_its_rank(algo, size, eager):
    algo_ = REGISTRIES["alltoall"][algo]
    # Rank i sends (i + 2 j) % 4 elements to rank j, all of value 100 i + j.
    def block(i, j):
        return np.full((i + 2 * j) % 4, 100 * i + j, dtype=np.int64)

    def rank_main(comm):
        rank = comm.Get_rank()
        send = np.concatenate([block(rank, j) for j in range(size)])
        recv_counts = [len(block(i, rank)) for i in range(size)]
        recv = np.full(sum(recv_counts), -99, dtype=np.int64)
        algo_.run(comm, send, bounds_of([len(block(rank, j)) for j in range(size)]), recv,
                  bounds_of(recv_counts))
        return recv

    for rank, got in enumerate(run_ranks(size, rank_main, eager)):
        want = np.concatenate([block(i, rank) for i in range(size)])
        assert np.array_equal(got, want), (algo, size, rank)


@pytest.mark.parametrize("eager", EAGER)
@pytest.mark.parametrize("size", range(1, 10))
@pytest.mark.parametrize("algo", ours("broadcast"))
def test_broadcast_gives_every_rank_the_roots_bytes(algo, size, eager):
    algo_ = REGISTRIES["broadcast"][algo]
    # No bytes, one, fewer than ranks (empty chunks), uneven chunks, a prime.
    for nbytes in sorted({0, 1, size - 1, 3 * size + 2, 101}):
        for root in range(size):
            def rank_main(comm):
                rank = comm.Get_rank()
                buf = values(rank, nbytes).astype(np.uint8)     # each rank's differ
                buf.flags.writeable = rank != root     # the root's vector is only read
                algo_.run(comm, buf, root)
                return buf

            want = values(root, nbytes).astype(np.uint8)
            for rank, got in enumerate(run_ranks(size, rank_main, eager)):
                assert np.array_equal(got, want), (algo, size, nbytes, root, rank)


@pytest.mark.parametrize("eager", EAGER)
@pytest.mark.parametrize("size", range(1, 10))
@pytest.mark.parametrize("algo", ours("reduce"))
def test_reduce_gives_the_root_the_sum_from_every_root(algo, size, eager):
    algo_ = REGISTRIES["reduce"][algo]
    int64 = DTYPES["int64"]
    # One element, fewer than ranks, a prime (the caller returns before the algorithm at 0).
    for count in sorted({1, max(size - 1, 1), 13}):
        for root in range(size):
            def rank_main(comm):
                rank = comm.Get_rank()
                send = values(rank, count, root)
                send.flags.writeable = rank != root     # the root's vector is only read
                recv = np.full(count, -99, dtype=np.int64) if rank == root else None
                # A workspace of exactly the size the algorithm asks for: too small shows.
                scratch = np.empty(algo_.workspace(size, rank, count, root), dtype=np.int64)
                reduction = algorithm.Reduction(int64, "sum", host_reducer(int64, "sum", 0),
                                                scratch)
                algo_.run(comm, send, recv, root, reduction)
                return recv

            got = run_ranks(size, rank_main, eager)
            want = sum(values(r, count, root) for r in range(size))
            assert np.array_equal(got[root], want), (algo, size, count, root)
            assert all(g is None for r, g in enumerate(got) if r != root)


@pytest.mark.parametrize("size", range(1, 10))
def test_the_scatter_sends_each_chunk_once_and_leaves_every_rank_its_own(size):
    # The cost model's scatter: the root sends the n(p-1)/p bytes it does not keep, each
    # byte once along the tree, and every rank receives its own chunk.
    nbytes = 7 * size + 3
    for root in range(size):
        scheds = [scatter_allgather_schedule(size, r, nbytes, root) for r in range(size)]
        bounds = algorithm.chunk_bounds(nbytes, size)
        assert sum(hi - lo for _, lo, hi in scheds[root].sends) == nbytes - bounds[1]
        for rank, sched in enumerate(scheds):
            vrank = (rank - root) % size
            if rank != root:
                lo, hi = sched.receive
                assert lo == bounds[vrank] and hi >= bounds[vrank + 1], (size, root, rank)
                parent = scheds[sched.parent]
                assert (rank, lo, hi) in parent.sends, (size, root, rank)


def test_an_alltoall_that_sends_before_it_receives_deadlocks_only_when_sends_are_synchronous():
    # What the pairwise Sendrecv avoids: every rank sending first, to rank + 1.
    def send_first(comm):
        size, rank = comm.Get_size(), comm.Get_rank()
        block, got = np.full(64, rank, dtype=np.int64), np.empty(64, dtype=np.int64)
        comm.Send(block, (rank + 1) % size, 3)
        comm.Recv(got, (rank - 1) % size, 3)
        return got

    assert [int(g[0]) for g in run_ranks(3, send_first, BUFFERED)] == [2, 0, 1]
    with pytest.raises(Deadlock):
        run_ranks(3, send_first, eager=0)
