"""The batch scripts in jobs/, submitted with sbatch to a real single-node Slurm.

The session fixture starts Slurm with scripts/slurm-local (and stops it afterwards if it
started it), which installs Debian's Slurm and munge packages where they are missing. That
takes root (slurmd runs as root) and, for packages not yet installed, apt-get: where either is
missing, the tests that submit jobs are skipped with a reason that names it. Jobs are sized
to this machine through sbatch options and HPCTRAIN_ARGS, never through a separate copy of
the script.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import note_launch

#: A Slurm of this machine's own, and jobs on it: these tests run alone (scripts/test).
pytestmark = pytest.mark.alone

REPO = Path(__file__).resolve().parents[1]
SLURM_LOCAL = REPO / "scripts" / "slurm-local"
JOB_TIMEOUT = 240  # s
SCRIPT_TIMEOUT = 120  # s: slurm-local status, env, down (up may install packages: 600 s)
#: What scripts/slurm-local and the tests run: the daemons, munge's client and Slurm's.
SLURM_TOOLS = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo",
               "scancel")


def missing_for_slurm():
    """Why scripts/slurm-local cannot bring Slurm up here, or "" if it can."""
    if os.geteuid() != 0:
        return f"needs root: scripts/slurm-local runs slurmd as root (euid {os.geteuid()})"
    absent = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]
    if absent and shutil.which("apt-get") is None:
        return (f"{', '.join(absent)} not installed, and no apt-get for scripts/slurm-local "
                f"to install them with")
    return ""


@pytest.fixture(scope="session")
def slurm_env():
    """Environment for sbatch against the local Slurm, which is up for the whole session."""
    missing = missing_for_slurm()
    if missing:
        pytest.skip(f"local Slurm: {missing}")
    status = subprocess.run([SLURM_LOCAL, "status"], capture_output=True, text=True,
                            timeout=SCRIPT_TIMEOUT)
    was_up = "slurmctld  running" in status.stdout
    up = subprocess.run([SLURM_LOCAL, "up"], capture_output=True, text=True, timeout=600)
    assert up.returncode == 0, f"scripts/slurm-local up failed:\n{up.stdout}\n{up.stderr}"
    conf = subprocess.run([SLURM_LOCAL, "env"], capture_output=True, text=True,
                          timeout=SCRIPT_TIMEOUT).stdout
    env = {**os.environ, "SLURM_CONF": conf.strip().split("=", 1)[1],
           "PATH": f"{Path(os.sys.executable).parent}:{os.environ['PATH']}"}
    yield env
    if not was_up:
        subprocess.run([SLURM_LOCAL, "down"], capture_output=True, timeout=SCRIPT_TIMEOUT)


def submit(env, script, tmp_path, *options, extra_env=None, args=(), via=()):
    """Submit the script (with ``args`` after it) from the project root and wait for the job
    to end; return (exit code, job output). ``via``: a command prefix that runs Slurm's
    commands where they reach slurmctld (``scripts/slurm-local exec --vcluster``).

    Not ``sbatch --wait``: it looks at the job 2 s after submitting, then every 2 s, which
    costs each of these short jobs a second or two; :func:`job_end` looks every
    ``POLL_S``."""
    note_launch()  # scripts/flake-gate repeats the tests that submit jobs
    out = tmp_path / "job.out"
    env = {**env, **(extra_env or {})}
    argv = [*via, "sbatch", "--parsable", f"--output={out}", *options, str(script), *args]
    submitted = subprocess.run(argv, cwd=REPO, env=env, text=True, capture_output=True,
                               timeout=SCRIPT_TIMEOUT)
    if submitted.returncode != 0:       # refused before any job existed
        return submitted.returncode, submitted.stdout + submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    code = job_end(env, job, via)
    if code is None:
        # Only waits: the job's processes belong to slurmd, and scancel ends them.
        subprocess.run([*via, "scancel", job], env=env, timeout=SCRIPT_TIMEOUT)
        pytest.fail(f"`{' '.join(argv)}`: job {job} did not end within {JOB_TIMEOUT} s "
                    f"(cancelled). Output:\n{out.read_text() if out.exists() else ''}")
    return code, out.read_text() if out.exists() else ""


POLL_S = 0.25
#: The states of a job that has ended (squeue(1)'s JOB STATE CODES).
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE")


def job_end(env, job, via=()):
    """The exit code of job ``job`` once it has ended (its signal's 128 + N if it was killed,
    1 if it ended otherwise than completed with 0), or None after ``JOB_TIMEOUT``. Its record
    stays MinJobAge (5 s, scripts/slurm-local) after its end: far longer than a poll."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        shown = subprocess.run([*via, "scontrol", "-o", "show", "job", job], env=env,
                               text=True, capture_output=True, timeout=SCRIPT_TIMEOUT)
        state = re.search(r"\bJobState=(\S+)", shown.stdout)
        if shown.returncode != 0 or state is None:
            pytest.fail(f"scontrol show job {job} does not know the job (its record went "
                        f"before it was seen to end?): {shown.stdout}{shown.stderr}")
        if state[1] in ENDED:
            status, signal = map(int, re.search(r"\bExitCode=(\d+):(\d+)", shown.stdout).groups())
            return status or (128 + signal if signal else int(state[1] != "COMPLETED"))
        time.sleep(POLL_S)
    return None


def test_info_job_runs_every_task_through_srun_pmix(slurm_env, tmp_path):
    code, output = submit(slurm_env, "jobs/info.sbatch", tmp_path,
                          "--nodes=1", "--ntasks-per-node=2")
    assert code == 0, output
    assert "# job " in output and ": 2 tasks on 1 node(s)" in output
    assert "hpctrain info: 2 ranks" in output


def test_info_job_with_the_mpirun_launcher(slurm_env, tmp_path):
    # Open MPI refuses root without these; on a cluster jobs do not run as root.
    root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    code, output = submit(slurm_env, "jobs/info.sbatch", tmp_path, "--nodes=1",
                          "--ntasks-per-node=2", extra_env={"HPCTRAIN_LAUNCHER": "mpirun",
                                                           **root})
    assert code == 0, output
    assert "hpctrain info: 2 ranks" in output


def test_bench_job_prints_its_table(slurm_env, tmp_path):
    code, output = submit(slurm_env, "jobs/bench.sbatch", tmp_path, "--nodes=1",
                          "--ntasks-per-node=2",
                          extra_env={"HPCTRAIN_ARGS": "-b 8 -e 4K -f 8 -n 2 -w 1 "
                                                      "--algos ring,tree,mpi"})
    assert code == 0, output
    assert "# hpctrain 0.1.0 bench allreduce" in output
    # A row per algorithm at every size (8, 64, 512, 4096 B), none with a wrong element.
    for size in (8, 64, 512, 4096):
        for algo in ("ring", "tree", "mpi"):
            row = rf"^\s+{size}\s+{size // 4}\s+float32\s+sum\s+{algo}\s+(?:[\d.]+\s+){{5}}0$"
            assert re.search(row, output, re.M), f"no {algo} row at {size} B:\n{output}"
    assert "# Out of bounds values : 0 OK" in output


def test_a_failing_job_fails_in_slurm_too(slurm_env, tmp_path):
    code, output = submit(slurm_env, "jobs/info.sbatch", tmp_path, "--nodes=1",
                          "--ntasks-per-node=2", extra_env={"HPCTRAIN_FAULT": "info.gather@1"})
    assert code != 0, output
    assert "[hpctrain] rank 1 of 2" in output


# jobs/train-cpu-multinode.sbatch: on two nodes in test_slurm_two_nodes.py.
@pytest.mark.parametrize("script", ["jobs/train-cpu.sbatch"])
def test_train_job_reaches_its_accuracy_line(slurm_env, tmp_path, script):
    # The multi-node script runs here on the one node (2 cores) this Slurm has: same body,
    # resized through sbatch's options.
    code, output = submit(slurm_env, script, tmp_path, "--nodes=1", "--ntasks-per-node=2",
                          "--cpus-per-task=1",
                          extra_env={"HPCTRAIN_ARGS": f"--epochs 3 --run-dir {tmp_path}/run"})
    assert code == 0, output
    assert "# job " in output and ": 2 tasks on 1 node(s)" in output
    accuracy = re.findall(r"^epoch\s+3/3 .* val_acc\s+([\d.]+)%", output, re.M)
    assert accuracy and float(accuracy[0]) > 80, output
    assert (tmp_path / "run" / "metrics.csv").exists()
    # The bar redraws itself after a carriage return; read_text() would turn it into "\n".
    assert b"\r" not in (tmp_path / "job.out").read_bytes(), "the job asked for --progress never"


# --- scripts/slurm-local itself (no Slurm needed) ---------------------------------------------

def test_down_leaves_alone_a_process_that_reused_a_daemons_pid(tmp_path):
    """A stale PID file whose number now belongs to another process: `down` must not kill
    it, and `status` must not call it running."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / "run").mkdir()
        for name in ("munged", "slurmctld", "slurmd"):
            (tmp_path / "run" / f"{name}.pid").write_text(f"{other.pid}\n")
        env = {**os.environ, "HPCTRAIN_SLURM_DIR": str(tmp_path)}
        status = subprocess.run([SLURM_LOCAL, "status"], env=env, capture_output=True,
                                text=True, timeout=SCRIPT_TIMEOUT)
        assert "running" not in status.stdout, status.stdout
        down = subprocess.run([SLURM_LOCAL, "down"], env=env, capture_output=True, text=True,
                              timeout=SCRIPT_TIMEOUT)
        assert down.returncode == 0, down.stdout + down.stderr
        assert "stopped" not in down.stdout, down.stdout
        assert other.poll() is None, "down killed a process that is not its daemon"
    finally:
        other.kill()
        other.wait(timeout=30)
