"""Whole-job behaviour under mpirun: the info table, abort on failure, and hang detection."""

import os
import pty
import re
import select
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO, MpirunHung, assert_ended_by, run_bounded, seconds_after_fault
from hpctrain.launch import (PROGRESS_TTY, kill_launch, launch_environment, mpirun_command,
                             split_options)
from hpctrain.mpi.waiting import WAIT_POLICY, YIELD_WHEN_IDLE, apply_wait_policy, wait_policy

FAULT_TIMEOUT = 60  # s: a normal 3-rank info launch takes well under 20 s here
FAIL_WITHIN = 10    # s from the fault to the end of the job: MPI_Abort, not a time-out


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
    assert re.search(r"MPI CUDA support (yes|no|unknown) \(", out)
    assert re.search(r"MPI waiting      (yields the core|spins|Open MPI's default)", out), out
    # The driver and the GPUs are asked per rank; the verdict names what is missing.
    assert re.search(r"CUDA driver\s+(yes|no), ", out) and re.search(r"GPUs visible\s+\S", out)
    assert re.search(r"device buffers\s+(yes|no: .+|unknown: .+) \(MPI gets CUDA memory", out)
    # No Open MPI banner per rank about a missing libcuda.so.1 (a CUDA-built Open MPI on a
    # machine without the driver): at most the table's own line names it.
    assert out.count("libcuda.so.1") <= 1, out
    assert out.count("hpctrain info:") == 1, "only rank 0 prints"


@pytest.mark.parametrize("np, rank", [(1, 0), (2, 1), (3, 0), (3, 2)])
def test_a_failing_rank_ends_the_whole_job(mpirun, hpctrain_cmd, np, rank):
    # Rank `rank` raises just before the gather in which rank 0 waits for everyone: without
    # MPI_Abort the other ranks would wait forever (see test_unguarded_failure_hangs).
    fault = f"info.gather@{rank}"
    result = mpirun(np, [*hpctrain_cmd, "info"], timeout=FAULT_TIMEOUT,
                    env={"HPCTRAIN_FAULT": fault})
    assert_ended_by(result, fault, np=np, within=FAIL_WITHIN)
    assert "hpctrain info:" not in result.output


@pytest.mark.parametrize("np", [2, 3])
def test_rank_0_failing_after_the_gather_ends_the_job(mpirun, hpctrain_cmd, np):
    result = mpirun(np, [*hpctrain_cmd, "info"], timeout=FAULT_TIMEOUT,
                    env={"HPCTRAIN_FAULT": "info.done@0"})
    assert result.returncode != 0
    assert f"[hpctrain] rank 0 of {np} on" in result.output
    assert seconds_after_fault(result) < FAIL_WITHIN, result.output


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
        mpirun(2, [sys.executable, str(script)], timeout=8)     # its ranks start in ~1 s
    message = str(hung.value)
    assert "launch hung: `" in message and "hang.py" in message and "within 8 s" in message
    pids = [int(p) for p in re.findall(r"pid (\d+)", message)]
    assert len(pids) == 2, message
    for pid in pids:
        assert not _alive(pid), f"rank process {pid} survived the kill"


@pytest.mark.alone
def test_a_hung_launch_is_killed_with_what_left_its_process_group():
    # As mpirun's local ranks, the child has a process group of its own (set -m); it also
    # ignores SIGTERM, as a rank stuck in a system call can seem to. The group kill misses it;
    # the session kill does not.
    script = "set -m; (trap '' TERM; echo pid $BASHPID; exec sleep 300) & wait"
    with pytest.raises(MpirunHung) as hung:
        run_bounded(["bash", "-c", script], timeout=3)
    pids = [int(p) for p in re.findall(r"pid (\d+)", str(hung.value))]
    assert len(pids) == 1, str(hung.value)
    assert not _alive(pids[0]), "the child in a process group of its own survived the kill"


def _alive(pid, within=5.0):
    """Whether ``pid`` still runs ``within`` seconds from now (a SIGKILLed process closes its
    files, which ends the launch's output, a moment before it is gone)."""
    deadline = time.monotonic() + within
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _running(pid)


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent's wait is missing.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.alone
def test_a_process_that_initialised_mpi_can_still_launch_mpirun(tmp_path):
    """An MPI singleton (MPI_Init without a launcher) exports its runtime's variables; an
    mpirun started with them inherited fails silently. Our launches drop them."""
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
    env = launch_environment({"PMIX_RANK": "0", "OMPI_MCA_ess": "singleton",
                              "OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_btl_tcp_if_include": "lo",
                              "SLURM_JOB_ID": "7", "PATH": "/bin", PROGRESS_TTY: "1"})
    assert env == {"OMPI_MCA_btl_tcp_if_include": "lo", "SLURM_JOB_ID": "7", "PATH": "/bin"}


# --- how ranks wait in MPI: yield the core when ranks and their threads outnumber the cores ---

@pytest.mark.parametrize("environ, cores, decision", [
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, 2, True),     # 4 busy threads on 2 cores
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, 2, False),    # one rank: a core for each thread
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 8, False),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, 1, True),     # a rank bound to one core
    ({"MPI_LOCALNRANKS": "3"}, 4, True),                # MPICH's Hydra
    ({"SLURM_NTASKS_PER_NODE": "8"}, 64, False),        # srun, without mpirun's variables
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "x"}, 2, None),     # unknown: Open MPI's default stands
    ({}, 2, None),
])
def test_ranks_yield_only_when_their_threads_outnumber_the_cores(environ, cores, decision):
    assert wait_policy(environ, cores)[0] is decision
    applied = dict(environ)
    apply_wait_policy(applied, cores)
    assert applied.get(YIELD_WHEN_IDLE) == ("1" if decision else None)


def test_a_wait_setting_of_the_users_own_wins():
    environ = {"OMPI_COMM_WORLD_LOCAL_SIZE": "4", YIELD_WHEN_IDLE: "0"}
    assert apply_wait_policy(environ, 2) == (None, "set by the user")
    assert environ == {"OMPI_COMM_WORLD_LOCAL_SIZE": "4", YIELD_WHEN_IDLE: "0"}
    # ... and reaches the ranks of a launch, where a choice of hpctrain's is made afresh.
    assert launch_environment(environ)[YIELD_WHEN_IDLE] == "0"
    ours = {"SLURM_NTASKS_PER_NODE": "4"}
    apply_wait_policy(ours, 2)
    assert ours[YIELD_WHEN_IDLE] == "1" and "4 rank(s)" in ours[WAIT_POLICY]
    assert YIELD_WHEN_IDLE not in launch_environment(ours)
    assert WAIT_POLICY not in launch_environment(ours)


SHOW_WAIT = [sys.executable, "-c", "import os, hpctrain; os.write(1, b'wait %r\\n' % "
                                   f"os.environ.get('{YIELD_WHEN_IDLE}'))"]


@pytest.mark.alone
@pytest.mark.parametrize("np", [1, 2, 3])
def test_every_rank_chooses_how_to_wait_when_it_imports_hpctrain(np):
    result = run_bounded([sys.executable, "-m", "hpctrain.launch", "-np", str(np), *SHOW_WAIT],
                         timeout=120, env={**launch_environment(), "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.output
    expected = "'1'" if 2 * np > len(os.sched_getaffinity(0)) else "None"
    assert result.output.count(f"wait {expected}") == np, result.output


# --- python -m hpctrain.launch: its flags, its argument split, the terminal it reports ---------

LAUNCHER = [sys.executable, "-m", "hpctrain.launch"]
# Each rank writes its line with one system call, so that the two ranks' lines never interleave.
SHOW_ARGV = [sys.executable, "-c",
             "import os, sys; os.write(1, b'argv %r\\n' % sys.argv[1:])"]
SHOW_TTY = [sys.executable, "-c",
            f"import os; os.write(1, b'tty %r\\n' % os.environ.get('{PROGRESS_TTY}'))"]


def test_the_terminal_is_reported_to_the_ranks_only_when_there_is_one():
    assert PROGRESS_TTY not in " ".join(mpirun_command(2, ["true"]))
    assert mpirun_command(2, ["true"], tty=True)[-3:] == ["-x", f"{PROGRESS_TTY}=1", "true"]


@pytest.mark.parametrize("rest, extra, command", [
    (["python", "a.py"], [], ["python", "a.py"]),
    (["python", "a.py", "--", "-k", "x"], [], ["python", "a.py", "--", "-k", "x"]),
    (["pytest", "--", "--"], [], ["pytest", "--", "--"]),
    (["-x", "FOO", "--", "python", "a.py"], ["-x", "FOO"], ["python", "a.py"]),
    (["-x", "FOO", "--", "python", "--", "b"], ["-x", "FOO"], ["python", "--", "b"]),
    (["--", "python"], [], ["python"]),
])
def test_double_dash_ends_the_mpirun_options_only_after_options(rest, extra, command):
    assert split_options(rest) == (extra, command)


def test_mpirun_options_need_the_double_dash():
    with pytest.raises(ValueError, match="followed by --"):
        split_options(["-x", "FOO", "python", "a.py"])


@pytest.mark.alone
def test_the_commands_own_double_dash_reaches_it():
    run = run_bounded([*LAUNCHER, "-np", "2", *SHOW_ARGV, "--", "x"], timeout=120,
                      env=launch_environment())
    assert run.returncode == 0, run.output
    assert run.output.count("argv ['--', 'x']") == 2, run.output


@pytest.mark.alone
def test_mpirun_options_before_the_double_dash_reach_mpirun():
    run = run_bounded([*LAUNCHER, "-np", "1", "-x", "HPCTRAIN_PROBE=7", "--", sys.executable,
                       "-c", "import os; print('probe', os.environ['HPCTRAIN_PROBE'])"],
                      timeout=120, env=launch_environment())
    assert run.returncode == 0 and "probe 7" in run.output, run.output


@pytest.mark.alone
def test_ranks_learn_that_the_launcher_writes_to_a_terminal():
    """mpirun gives ranks a pseudo-terminal whatever its own stdout is: only the launcher
    knows, and tells every rank through HPCTRAIN_PROGRESS_TTY."""
    on_terminal = run_on_terminal([*LAUNCHER, "-np", "2", *SHOW_TTY], timeout=120)
    assert on_terminal.count("tty '1'") == 2, on_terminal
    # The same launch into a pipe, from an environment that says "terminal" (a launch started
    # by a rank of one that does): the variable is not inherited, and no rank gets it.
    piped = run_bounded([*LAUNCHER, "-np", "2", *SHOW_TTY], timeout=120,
                        env={**os.environ, PROGRESS_TTY: "1"})
    assert piped.returncode == 0, piped.output
    assert piped.output.count("tty None") == 2, piped.output


def run_on_terminal(argv, *, timeout):
    """Run ``argv`` with a pseudo-terminal as stdout and stderr; return what it wrote. A run
    that outlives ``timeout`` is killed with what it started, and fails the test."""
    reader, terminal = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal,
                            env=launch_environment(), cwd=REPO, start_new_session=True)
    os.close(terminal)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([reader], [], [], 1)[0]:
                continue
            try:
                chunk = os.read(reader, 4096)
            except OSError:  # EIO: every process holding the terminal has closed it
                break
            if not chunk:
                break
            chunks.append(chunk)
        else:
            kill_launch(proc)
            pytest.fail(f"{argv} did not finish within {timeout} s: {b''.join(chunks)!r}")
    finally:
        os.close(reader)
    proc.wait(timeout=30)
    return b"".join(chunks).decode(errors="replace")
