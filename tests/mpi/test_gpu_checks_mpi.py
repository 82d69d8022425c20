"""Run under mpirun: the GPU checks that are collectives give every rank the same verdict,
so that a problem found on one node stops every rank with one message instead of leaving
the others in their next collective (no GPU needed: the per-rank facts are faked)."""

import pytest

from conftest import all_ranks
from hpctrain import devices, gpu_checks
from hpctrain.errors import UsageError

pytestmark = pytest.mark.mpi


def test_ranks_on_node_counts_this_nodes_ranks(comm):
    on_node = devices.ranks_on_node(comm)
    # Every rank of a local launch shares the node; node-local ranks are 0..on_node-1.
    ok = on_node == comm.size and devices.node_local_rank(comm) == comm.rank
    all_ranks(comm, ok, [f"ranks on node {on_node}, size {comm.size}"])


@pytest.mark.parametrize("culprit", [0, -1])
def test_one_ranks_problem_reaches_every_rank_named_by_rank(comm, monkeypatch, culprit):
    culprit %= comm.size
    mine = f"problem of rank {comm.rank}"
    monkeypatch.setattr(gpu_checks, "_horovod_problem",
                        lambda c, on_node, option: mine if comm.rank == culprit else None)
    reason = gpu_checks.horovod_cuda_reason(comm, "x")
    want = mine if comm.rank == culprit else f"rank {culprit}: problem of rank {culprit}"
    all_ranks(comm, reason == want, [f"got {reason!r}, want {want!r}"])
    with pytest.raises(UsageError):            # on every rank, in the same call
        gpu_checks.check_horovod_cuda(comm, "x")


def test_no_problem_anywhere_is_none_everywhere(comm, monkeypatch):
    monkeypatch.setattr(gpu_checks, "_horovod_problem", lambda c, on_node, option: None)
    reason = gpu_checks.horovod_cuda_reason(comm, "x")
    all_ranks(comm, reason is None, [f"got {reason!r}"])
