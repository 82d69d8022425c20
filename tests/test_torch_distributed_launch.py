"""The ``hpctrain`` backend as a script meets it: the two lines under mpirun and alone, and
bad input (``WORLD_SIZE`` that disagrees with MPI, a ``new_group`` one rank skips, gloo
without an address) ending every rank with one clear message, never a hang; a collective
past the group's timeout failing on every rank; and, on the fault-tolerant stack, a rank's
death failing every survivor's pending work.

The collectives themselves are tested under mpirun at np 1..4 in
tests/mpi/test_torch_distributed.py and tests/mpi/test_torch_distributed_training.py.
"""

import os
import re
import socket
import sys

import pytest

from conftest import REPO, run_bounded
from test_ft_stack import DETECTED_WITHIN, ft_launch

PROGRAM = "tests/programs/torch_distributed.py"
# s, from launch to exit: torch's import in every rank (3-6 s on 2 cores), more beside other
# jobs; a hang is killed at HANG and fails the test.
WITHIN = 30
HANG = 120


def free_port():
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
def test_an_mpi_below_thread_multiple_is_refused_on_every_rank(mpirun):
    run = mpirun(2, [sys.executable, PROGRAM, "serialized"], timeout=HANG)
    assert run.returncode == 2, run.output
    message = "the hpctrain backend needs MPI_THREAD_MULTIPLE"
    assert run.output.count(message) == 1, run.output      # rank 0 says it, once
    assert "MPI gives MPI_THREAD_SERIALIZED" in run.output, run.output
    assert run.elapsed < WITHIN, run.output


@pytest.mark.alone
def test_an_mpi_below_thread_multiple_is_refused_with_torchs_rendezvous_too():
    # MASTER_ADDR set: torch's own env:// rendezvous, then the backend's creator checks.
    run = alone("serialized", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                RANK="0", WORLD_SIZE="1")
    assert run.returncode == 2, run.output
    assert "the hpctrain backend needs MPI_THREAD_MULTIPLE" in run.output, run.output
    assert "MPI gives MPI_THREAD_SERIALIZED" in run.output, run.output


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


@pytest.mark.alone
def test_a_collective_past_the_timeout_fails_on_every_rank_and_the_job_goes_on(mpirun):
    run = mpirun(3, [sys.executable, PROGRAM, "timeout"], timeout=HANG)
    assert run.returncode == 0, run.output
    # The program catches RuntimeError (gloo's type) alone: anything else ends the job.
    # Not anchored at a line's start: mpirun may relay one rank's line before another's ends.
    failed = re.findall(r"rank (\d): \w+: all_reduce\(.*?\): Timed out waiting 2000ms for "
                        r"rank\(s\) 1, 2, which have not called it", run.output)
    assert sorted(failed) == ["0", "1", "2"], run.output
    assert "hpctrain over 3 ranks: [6.0, 6.0, 6.0]" in run.output, run.output
    assert run.elapsed < WITHIN, run.output


@pytest.mark.parametrize("np, victim", [(3, 1), (4, 0)], ids=["np3-rank1", "np4-rank0"])
def test_a_lost_rank_fails_every_pending_work_of_the_survivors(ft_python, np, victim):
    run = ft_launch(ft_python, np, REPO / "tests" / "programs" / "ulfm_torch_distributed.py",
                    str(victim))
    out = run.output
    assert run.returncode == 0, out
    killed = float(re.search(rf"^rank {victim}: SIGKILL at t=([\d.]+)$", out, re.M).group(1))
    survivors = [r for r in range(np) if r != victim]
    failed = re.findall(r"^rank (\d+): (.+) failed at t=([\d.]+): (\w+): (.*)$", out, re.M)
    seen = {(int(rank), what) for rank, what, _, _, _ in failed}
    pending = ["DDP backward", "future", "all_reduce", "later all_reduce"]
    want = {(r, what) for r in survivors for what in pending} | \
        {(survivors[0], "recv from the victim"), (survivors[0], "recv from a survivor")}
    assert seen == want, out
    # Every error is gloo's type, and says that a rank died (the one whose death this rank
    # learnt of itself, or "a rank" where it learnt of it from a revoke).
    assert all(kind in ("RuntimeError", "ProcessFailure") and
               re.search(r"(rank\(s\) \d+ of \d+|a rank) failed \(MPI: MPI_ERR_", message)
               for _, _, _, kind, message in failed), out
    assert max(float(at) for _, _, at, _, _ in failed) - killed < DETECTED_WITHIN, out
    assert sorted(int(r) for r in re.findall(r"^rank (\d+): ended$", out, re.M)) == \
        survivors, out
