"""Whole-job behaviour under mpirun: the info table, abort on failure, and hang detection."""

import os
import re
import sys
import textwrap

import pytest

from conftest import MpirunHung

FAULT_TIMEOUT = 60  # s: a normal 3-rank info launch takes well under 20 s here


def test_info_lists_every_rank_and_the_horovod_build(mpirun, hpctrain_cmd):
    result = mpirun(3, [*hpctrain_cmd, "info"], timeout=120)
    assert result.returncode == 0, result.output
    out = result.output
    assert "hpctrain info: 3 ranks" in out
    assert "world size       3" in out
    ranks = re.findall(r"^\s+(\d+)\s+\S+\s+(\d+)\s+(\d+)\s+", out, flags=re.M)
    assert [int(r[0]) for r in ranks] == [0, 1, 2]
    assert len({r[1] for r in ranks}) == 3, "every rank is a process of its own"
    assert "same on every rank: yes" in out
    assert re.search(r"frameworks: .*PyTorch.*; controllers: .*MPI", out), out
    assert re.search(r"CUDA-aware MPI\s+(yes|no|unknown) \(", out)
    assert out.count("hpctrain info:") == 1, "only rank 0 prints"


@pytest.mark.parametrize("np, rank", [(np, rank) for np in (1, 2, 3) for rank in range(np)])
def test_a_failing_rank_ends_the_whole_job(mpirun, hpctrain_cmd, np, rank):
    # Rank `rank` raises just before the gather in which rank 0 waits for everyone: without
    # MPI_Abort the other ranks would wait forever (see test_unguarded_failure_hangs).
    result = mpirun(np, [*hpctrain_cmd, "info"], timeout=FAULT_TIMEOUT,
                    env={"HPCTRAIN_FAULT": f"info.gather@{rank}"})
    assert result.returncode != 0
    assert f"[hpctrain] rank {rank} of {np} on" in result.output
    assert "Traceback (most recent call last)" in result.output
    assert f"InjectedFault: injected fault at 'info.gather' on rank {rank}" in result.output
    assert "hpctrain info:" not in result.output


@pytest.mark.parametrize("np", [2, 3])
def test_rank_0_failing_after_the_gather_ends_the_job(mpirun, hpctrain_cmd, np):
    result = mpirun(np, [*hpctrain_cmd, "info"], timeout=FAULT_TIMEOUT,
                    env={"HPCTRAIN_FAULT": "info.done@0"})
    assert result.returncode != 0
    assert f"[hpctrain] rank 0 of {np} on" in result.output


HANGING_JOB = textwrap.dedent("""
    import os, sys
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    print(f"pid {os.getpid()}", flush=True)
    if comm.rank == 1:
        raise RuntimeError("rank 1 fails outside the guard")
    comm.gather(comm.rank, root=0)   # rank 0 waits here for rank 1, forever
""")


def test_unguarded_failure_hangs_and_the_harness_reports_it(mpirun, tmp_path):
    # The same failure as above, without python -m hpctrain's guard, really hangs: the harness
    # must turn that into a failure naming the launch, and leave no rank running.
    script = tmp_path / "hang.py"
    script.write_text(HANGING_JOB)
    with pytest.raises(MpirunHung) as hung:
        mpirun(2, [sys.executable, str(script)], timeout=15)
    message = str(hung.value)
    assert "launch hung: `" in message and "hang.py" in message and "within 15 s" in message
    pids = [int(p) for p in re.findall(r"pid (\d+)", message)]
    assert len(pids) == 2, message
    for pid in pids:
        assert not _alive(pid), f"rank process {pid} survived the kill"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent's wait is missing.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_process_that_initialised_mpi_can_still_launch_mpirun(tmp_path):
    """An MPI singleton (MPI_Init without a launcher) exports its runtime's variables; an
    mpirun started with them inherited fails silently. Our launches drop them."""
    import subprocess

    from hpctrain.launch import launch_environment

    program = textwrap.dedent("""
        import subprocess, sys
        from mpi4py import MPI
        from hpctrain.launch import launch_environment, mpirun_command
        MPI.COMM_WORLD.Barrier()
        argv = mpirun_command(2, [sys.executable, "-c", "print('child ran')"])
        env = launch_environment() if sys.argv[1] == "clean" else None
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        print("rc", done.returncode, done.stdout.count("child ran"))
    """)
    script = tmp_path / "nested.py"
    script.write_text(program)
    clean = subprocess.run([sys.executable, str(script), "clean"], capture_output=True,
                           text=True, timeout=120, env=launch_environment())
    assert clean.stdout.strip() == "rc 0 2", clean.stdout + clean.stderr
    # The variables dropped are the ones that break it: inheriting them fails.
    inherited = subprocess.run([sys.executable, str(script), "inherit"], capture_output=True,
                               text=True, timeout=120, env=launch_environment())
    assert inherited.stdout.strip() != "rc 0 2", inherited.stdout + inherited.stderr


def test_launch_environment_keeps_user_settings():
    from hpctrain.launch import launch_environment

    env = launch_environment({"PMIX_RANK": "0", "OMPI_MCA_ess": "singleton",
                              "OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_btl_tcp_if_include": "lo",
                              "SLURM_JOB_ID": "7", "PATH": "/bin"})
    assert env == {"OMPI_MCA_btl_tcp_if_include": "lo", "SLURM_JOB_ID": "7", "PATH": "/bin"}
