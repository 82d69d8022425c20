"""scripts/torch-dist-suite's peer suites, on a small tree of our own laid out as PyTorch's:
a spawning test class runs with every MPI rank as one of its ranks, a class on threads is left
out and counted, and a test that hangs is counted as hung while the suite goes on after it.

PyTorch's own files are not needed (nor copied): the tree is written here, in the shape of
``test/distributed/tensor/test_*.py``.
"""

import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, run_bounded

SUITE = str(REPO / "scripts" / "torch-dist-suite")
# A test of the tiny tree that hangs is ended after HUNG s; the whole run (torch imported
# twice by every rank, once more after the hang) is killed at HANG.
HUNG = 8
HANG = 300

TINY = '''
from mpi4py import MPI

import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor
from torch.testing._internal.common_distributed import MultiThreadedTestCase
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase, with_comms)


class Spawning(DTensorTestBase):
    @property
    def world_size(self):
        return 8        # the job's size wins

    @with_comms
    def test_a_sharded_tensor_gathers_back(self):
        full = torch.arange(4.0 * self.world_size).reshape(self.world_size, 4)
        sharded = distribute_tensor(full, self.build_device_mesh(), [Shard(0)])
        self.assertEqual(sharded.to_local(), full[self.rank:self.rank + 1])
        self.assertEqual(sharded.full_tensor(), full)

    def test_b_rank_zero_waits_for_ever(self):
        if self.rank == 0:      # rank 1 never sends: a hang the watchdog must end
            MPI.COMM_WORLD.recv(source=1, tag=77)

    @with_comms
    def test_c_after_the_hang(self):
        self.assertEqual(dist.get_world_size(), self.world_size)


class OnThreads(MultiThreadedTestCase):
    def test_not_ours(self):
        pass
'''


def tiny_tree(root):
    """A folder laid out as a PyTorch checkout, with one DTensor-style test file."""
    folder = root / "test" / "distributed" / "tensor"
    folder.mkdir(parents=True)
    (folder / "test_tiny.py").write_text(textwrap.dedent(TINY))
    return root


def test_peer_suite_without_pytorch_tests_says_where_to_get_them(tmp_path):
    # It stops before any mpirun: a plain subprocess, beside the other tests.
    run = subprocess.run([sys.executable, SUITE, "--suites", "fsdp2", "--logs", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "git clone --depth 1 --branch v" in run.stdout + run.stderr, run.stdout + run.stderr


@pytest.mark.alone
def test_peer_suite_adapts_spawning_classes_and_goes_on_after_a_hang(tmp_path):
    tree = tiny_tree(tmp_path / "pytorch")
    run = run_bounded([sys.executable, SUITE, "--suites", "dtensor", "--pytorch-tests",
                       str(tree), "--np", "2", "--backends", "hpctrain",
                       "--test-timeout", str(HUNG), "--logs", str(tmp_path / "logs")],
                      timeout=HANG)
    assert "dtensor np 2      hpctrain: 2 passed, 0 failed, 0 errors, 0 skipped, 1 left " \
           "out, 1 hung" in run.output, run.output
    assert "test_tiny.Spawning.test_b_rank_zero_waits_for_ever did not end" in \
        (tmp_path / "logs" / "dtensor-np2-hpctrain.log").read_text()
    assert run.returncode == 1, run.output         # a hung test fails the suite
