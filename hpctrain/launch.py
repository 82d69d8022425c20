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
"""

import os
import shutil
import sys

#: Set to ``1`` in every rank's environment when the launcher writes to a terminal.
PROGRESS_TTY = "HPCTRAIN_PROGRESS_TTY"

USAGE = "usage: python -m hpctrain.launch -np N [MPIRUN OPTIONS --] COMMAND..."


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
#: ``HPCTRAIN_PROGRESS_TTY`` goes too: it describes the output of the launch that set it, and
#: a launch started from one of its ranks (a test, a study) writes somewhere else.
RUNTIME_VARIABLE_PREFIXES = ("PMIX_", "ORTE_", "OMPI_COMM_WORLD_", "OMPI_APP_CTX_",
                             "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_orte_", PROGRESS_TTY)


def launch_environment(environ=None):
    """``environ`` (default ``os.environ``) without the variables of a running MPI runtime."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in environ.items()
            if not name.startswith(RUNTIME_VARIABLE_PREFIXES)}


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


def main(argv=None):
    """``python -m hpctrain.launch -np N [MPIRUN OPTIONS --] COMMAND...``: exec mpirun."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] not in ("-np", "-n") or not argv[1].isdigit():
        sys.exit(USAGE)
    np = int(argv[1])
    try:
        extra, command = split_options(argv[2:])
    except ValueError as exc:
        sys.exit(f"python -m hpctrain.launch: {exc}\n{USAGE}")
    if not command:
        sys.exit("python -m hpctrain.launch: no command to launch")
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("mpirun not found: install Open MPI (scripts/setup does) or put it on PATH")
    full = mpirun_command(np, command, mpirun=mpirun, extra=extra, tty=sys.stdout.isatty())
    os.execve(mpirun, full, launch_environment())


if __name__ == "__main__":
    main()
