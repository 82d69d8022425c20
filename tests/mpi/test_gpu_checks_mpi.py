"""Run under mpirun: the GPU checks that are collectives give every rank the same verdict,
so that a problem found on one node stops every rank with one message instead of leaving
the others in their next collective (no GPU needed: the per-rank facts are faked)."""

import pytest

from conftest import all_ranks
from hpctrain import devices, gpu_checks
from hpctrain.errors import Verdict

pytestmark = pytest.mark.mpi


def test_ranks_on_node_counts_this_nodes_ranks(comm):
    on_node = devices.ranks_on_node(comm)
    # Every rank of a local launch shares the node; node-local ranks are 0..on_node-1.
    ok = on_node == comm.size and devices.node_local_rank(comm) == comm.rank
    all_ranks(comm, ok, [f"ranks on node {on_node}, size {comm.size}"])


def one_line(verdict):
    return None if verdict is None else verdict.line()


@pytest.mark.parametrize("culprit", [0, -1])
def test_one_ranks_problem_reaches_every_rank_named_by_rank(comm, monkeypatch, culprit):
    culprit %= comm.size
    monkeypatch.setattr(gpu_checks, "_horovod_problem",
                        lambda c, on_node, option: "problem" if comm.rank == culprit else None)
    reason = one_line(gpu_checks.horovod_cuda_verdict(comm, "x"))
    # The same words on every rank; the culprit is named unless it is every rank.
    want = "problem" if comm.size == 1 else f"problem (rank {culprit} of {comm.size})"
    all_ranks(comm, reason == want, [f"got {reason!r}, want {want!r}"])
    with pytest.raises(Verdict) as raised:     # on every rank, in the same call
        gpu_checks.check_horovod_cuda(comm, "x")
    all_ranks(comm, raised.value.problems == [("problem", [culprit])],
              [f"got {raised.value.problems}"])


def test_every_distinct_problem_is_named_once_with_its_ranks(comm, monkeypatch):
    # Two kinds of node: rank 0 finds one problem, every other rank another.
    monkeypatch.setattr(gpu_checks, "_horovod_problem",
                        lambda c, on_node, option: f"kind {min(comm.rank, 1)}")
    reason = one_line(gpu_checks.horovod_cuda_verdict(comm, "x"))
    others = ", ".join(map(str, range(1, comm.size)))
    want = {1: "kind 0", 2: "kind 0 (rank 0 of 2); kind 1 (rank 1 of 2)"}.get(
        comm.size, f"kind 0 (rank 0 of {comm.size}); kind 1 (ranks {others} of {comm.size})")
    all_ranks(comm, reason == want, [f"got {reason!r}, want {want!r}"])


def test_no_problem_anywhere_is_none_everywhere(comm, monkeypatch):
    monkeypatch.setattr(gpu_checks, "_horovod_problem", lambda c, on_node, option: None)
    reason = one_line(gpu_checks.horovod_cuda_verdict(comm, "x"))
    all_ranks(comm, reason is None, [f"got {reason!r}"])
