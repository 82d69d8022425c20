"""Launch hpctrain with mpirun on this machine, adding the flags a local run needs.

``python -m hpctrain.launch -np 4 python -m hpctrain info`` runs ``mpirun`` with:

- ``--allow-run-as-root`` when we are root (Open MPI refuses root otherwise; containers and
  CI run as root);
- ``--oversubscribe``, always: Open MPI refuses more ranks than it counts slots, and it counts
  them its own way (the physical cores hwloc finds), which ``os.cpu_count()`` does not
  predict; the tests run 4 ranks on 2 cores;
- ``--bind-to none``: with oversubscription, binding would pin several ranks to one core;
- ``-x HPCTRAIN_PROGRESS_TTY=1`` when the launcher's own stdout is a terminal: mpirun hands
  every rank a pseudo-terminal whatever its own output is, so only the launcher can tell
  rank 0 that a progress bar will be seen (``hpctrain.train.report.progress_enabled``).

On a cluster none of these is needed: launch with ``mpirun`` or ``srun`` directly.

:func:`run_bounded` runs a launch with a time limit, and kills a hung one with every process
it started (the tests and ``hpctrain study`` launch through it).

:mod:`hpctrain.launch.output` passes a launch's output on (tagged by rank or not) and sums up
a failed job in one block. ``python -m hpctrain.launch`` is :mod:`hpctrain.launch.__main__`;
with ``--elastic`` it runs
:mod:`hpctrain.launch.elastic`, which starts the job again when ranks are lost.
"""

import ctypes
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

#: Set to ``1`` in every rank's environment when the launcher writes to a terminal.
PROGRESS_TTY = "HPCTRAIN_PROGRESS_TTY"

def find_mpirun():
    """The path of ``mpirun``; ``FileNotFoundError`` saying how to get one."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise FileNotFoundError("mpirun not found: install Open MPI (scripts/setup does) or "
                                "put it on PATH")
    return mpirun


def srun_command(np, command, environ=None):
    """The ``srun`` argv that starts ``command`` on ``np`` tasks of this Slurm allocation:
    ``srun --mpi=pmix --kill-on-bad-exit=1 -N K -n NP`` (K: :func:`srun_nodes`)."""
    return ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", *srun_nodes(np, environ),
            "-n", str(np), *command]


def srun_nodes(ranks, environ=None):
    """``-N K``: the fewest nodes of the allocation that hold ``ranks`` tasks, so that a sweep
    over rank counts is a sweep over node counts (srun would otherwise spread the tasks over
    every node). Nothing when the allocation does not say its tasks per node."""
    environ = os.environ if environ is None else environ
    per_node = environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    if not per_node.isdigit() or int(per_node) < 1:
        return []
    return ["-N", str(-(-ranks // int(per_node)))]


def mpirun_command(np, command, *, mpirun="mpirun", extra=(), tty=False):
    """The ``mpirun`` argv that runs ``command`` on ``np`` local ranks.

    ``tty``: the launcher's output is a terminal (exports ``HPCTRAIN_PROGRESS_TTY=1``).
    """
    if np < 1:
        raise ValueError(f"np must be >= 1, got {np}")
    argv = [mpirun, "-np", str(np)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    # Always, rather than when np exceeds a core count of ours: Open MPI's slots are the
    # physical cores hwloc finds, os.cpu_count() counts logical CPUs (twice as many with
    # hyper-threads), so ours can say there is room where Open MPI refuses. The flag only
    # lifts the limit: with np within the slots nothing changes, and Open MPI still notices
    # when a node really is oversubscribed (and then has idle ranks yield the CPU).
    argv.append("--oversubscribe")
    argv += ["--bind-to", "none"]
    if tty:
        argv += ["-x", f"{PROGRESS_TTY}=1"]
    argv += [*extra, *command]
    return argv


#: Variables through which a running MPI process (an mpirun rank, or a singleton: a process
#: that called ``MPI_Init`` without a launcher) reaches its own runtime. A new ``mpirun``
#: started with them inherited joins that runtime instead of starting its own, and fails
#: without a word; they are dropped from the environment of every launch we start.
#: Settings that users give (``OMPI_MCA_btl_tcp_if_include`` and the like) are kept.
RUNTIME_VARIABLE_PREFIXES = ("PMIX_", "ORTE_", "OMPI_COMM_WORLD_", "OMPI_APP_CTX_",
                             "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_orte_")


def launch_environment(environ=None):
    """``environ`` (default ``os.environ``) without the variables of a running MPI runtime,
    nor ``HPCTRAIN_PROGRESS_TTY``, nor a wait policy hpctrain chose."""
    from ..mpi.waiting import WAIT_POLICY, YIELD_WHEN_IDLE

    environ = os.environ if environ is None else environ
    # PROGRESS_TTY describes the output of the launch that set it; a launch started from one
    # of its ranks (a test, a study) writes somewhere else. A wait policy hpctrain chose here
    # was for this launch's ranks per node; the new launch's ranks choose their own.
    ours = {PROGRESS_TTY} | ({WAIT_POLICY, YIELD_WHEN_IDLE} if WAIT_POLICY in environ else set())
    return {name: value for name, value in environ.items()
            if not name.startswith(RUNTIME_VARIABLE_PREFIXES) and name not in ours}


class LaunchHung(RuntimeError):
    """A launch that did not finish within its time limit; it has been killed with every
    process it started. ``output``: what it wrote (stdout, then stderr)."""

    def __init__(self, argv, timeout, output):
        super().__init__(f"`{shlex.join(argv)}` did not finish within {timeout} s")
        self.argv, self.timeout, self.output = argv, timeout, output


def run_bounded(argv, timeout, *, env=None, cwd=None, merge_stderr=True):
    """Run ``argv`` (a launcher: mpirun, srun, scripts/vcluster mpirun, ...) and return its
    ``subprocess.CompletedProcess``, with text output; stderr goes into stdout when
    ``merge_stderr``. If it outlives ``timeout`` seconds it is killed with every process it
    started (:func:`kill_launch`) and ``LaunchHung`` is raised."""
    argv = [str(a) for a in argv]
    # A session of its own, so that a hung launch can be killed with everything it started
    # (subprocess.run's timeout kills the launcher alone).
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                            text=True, env=env, cwd=cwd, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LaunchHung(argv, timeout, kill_launch(proc)) from None
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def _libc_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


PRCTL = _libc_prctl() if sys.platform.startswith("linux") else None
PR_SET_PDEATHSIG = 1


def end_with_launcher():
    """For ``Popen(preexec_fn=...)`` of a launch (mpirun, srun): the kernel sends it SIGTERM
    when the launcher that started it dies, even by SIGKILL, which no handler of ours sees;
    it would otherwise go on with its ranks. Linux only (elsewhere nothing)."""
    if PRCTL is not None:
        PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def kill_launch(proc):
    """End the launch ``proc`` (a ``Popen`` started in a session of its own) and every
    process it started; return the rest of its output (stdout, then stderr, if piped)."""
    # mpirun forwards SIGTERM to its ranks and has its daemons on other hosts end theirs.
    # Then SIGKILL for what is left: the process group, and every other process of the
    # session, for Open MPI gives each local rank a process group of its own, and those of a
    # SIGKILLed mpirun live on. Once the launcher has exited after the SIGTERM, what is left
    # of its session (a rank that ignored the signal, holding the output open) has no one to
    # end it: it is killed then, not at the end of the grace.
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGKILL:
            _kill_session(proc.pid)
        output = _communicate(proc, KILL_GRACE, until_exit=sig == signal.SIGTERM)
        if output is not None:
            return "".join(part or "" for part in output)
    return ""


KILL_GRACE = 10     # s: for a launcher to end its ranks after SIGTERM; for SIGKILL to work


def _communicate(proc, seconds, *, until_exit):
    """``proc.communicate()`` within ``seconds``, or None; with ``until_exit``, None also as
    soon as ``proc`` has exited while something else still holds its output open."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        try:
            return proc.communicate(timeout=max(0.0, min(left, 0.1) if until_exit else left))
        except subprocess.TimeoutExpired:   # communicate again: nothing read is lost
            if left <= 0 or (until_exit and proc.poll() is not None):
                return None


def _kill_session(session):
    """SIGKILL every process of ``session`` (Linux: read from /proc)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # Fields after the command name, which may hold spaces: state ppid pgrp session.
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[3]) == session:
                os.kill(int(stat.parent.name), signal.SIGKILL)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile


def split_options(rest):
    """``(mpirun options, command)`` from the words after ``-np N``.

    A ``--`` ends the mpirun options only when there are options, that is when the first word
    is one (``-x FOO -- python ...``); a ``--`` after a program's name is the program's own
    (``python -m pytest ... -- -k x``) and stays in the command. Options without the ``--``
    that ends them are a usage error: where they end cannot be told.
    """
    if not rest or not rest[0].startswith("-"):
        return [], list(rest)
    if "--" not in rest:
        raise ValueError("mpirun options must be followed by -- and the command")
    end = rest.index("--")
    return rest[:end], rest[end + 1:]
