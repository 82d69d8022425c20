"""The ``hpctrain`` backend as a script meets it: the two lines under mpirun and alone, and
bad input (``WORLD_SIZE`` that disagrees with MPI, a ``new_group`` one rank skips, gloo
without an address) ending every rank with one clear message, never a hang.

The collectives themselves are tested under mpirun at np 1..4 in
tests/mpi/test_torch_distributed.py and tests/mpi/test_torch_distributed_training.py.
"""

import os
import sys

import pytest

from conftest import run_bounded

PROGRAM = "tests/programs/torch_distributed.py"
# s, from launch to exit: torch's import in every rank (3-6 s on 2 cores), more beside other
# jobs; a hang is killed at HANG and fails the test.
WITHIN = 30
HANG = 120


def alone(case, **env):
    """The program run without any launcher (a singleton MPI world)."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("OMPI_", "PMIX_", "MASTER_", "RANK", "WORLD_SIZE"))}
    return run_bounded([sys.executable, PROGRAM, case], timeout=HANG, env={**environ, **env})


@pytest.mark.alone
def test_importing_starts_nothing():
    run = alone("import")
    assert run.returncode == 0, run.output
    assert "hpctrain registered: True; MPI imported: False; threads: 1" in run.output, run.output


@pytest.mark.alone
def test_two_lines_alone():
    run = alone("sum")
    assert run.returncode == 0, run.output
    assert "hpctrain over 1 ranks: [1.0, 1.0, 1.0]" in run.output, run.output


@pytest.mark.alone
def test_world_size_that_mpi_contradicts_alone():
    run = alone("sum", WORLD_SIZE="2")
    assert run.returncode == 2, run.output
    assert "WORLD_SIZE (or world_size=) is 2, but MPI started 1 rank(s)" in run.output, \
        run.output
    assert "Traceback" not in run.output, run.output


@pytest.mark.alone
def test_two_lines_under_mpirun(mpirun):
    run = mpirun(3, [sys.executable, PROGRAM, "sum"], timeout=HANG)
    assert run.returncode == 0, run.output
    assert "hpctrain over 3 ranks: [6.0, 6.0, 6.0]" in run.output, run.output


@pytest.mark.alone
def test_world_size_that_mpi_contradicts_under_mpirun(mpirun):
    run = mpirun(2, [sys.executable, PROGRAM, "sum"], timeout=HANG, env={"WORLD_SIZE": "3"})
    assert run.returncode == 2, run.output
    message = "WORLD_SIZE (or world_size=) is 3, but MPI started 2 rank(s)"
    assert run.output.count(message) == 1, run.output      # rank 0 says it, once
    assert run.elapsed < WITHIN, run.output


@pytest.mark.alone
def test_new_group_that_one_rank_skips(mpirun):
    run = mpirun(2, [sys.executable, PROGRAM, "skip-new-group"], timeout=HANG)
    assert run.returncode != 0, run.output
    assert "rank 1: dist.new_group([0, 1]) (every rank of the default group calls new_group" \
        in run.output, run.output
    assert run.elapsed < WITHIN, run.output


@pytest.mark.alone
def test_gloo_without_an_address_names_what_to_set(mpirun):
    run = mpirun(2, [sys.executable, PROGRAM, "gloo"], timeout=HANG)
    assert run.returncode != 0, run.output
    assert "init_process_group('gloo') without MASTER_ADDR and MASTER_PORT" in run.output, \
        run.output
    assert run.elapsed < WITHIN, run.output
