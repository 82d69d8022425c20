"""Launch hpctrain with mpirun on this machine, adding the flags a local run needs.

``python -m hpctrain.launch -np 4 python -m hpctrain info`` runs ``mpirun`` with:

- ``--allow-run-as-root`` when we are root (Open MPI refuses root otherwise; containers and
  CI run as root);
- ``--oversubscribe`` when more ranks are asked for than this machine has cores (Open MPI
  refuses otherwise; the tests run 4 ranks on 2 cores);
- ``--bind-to none``: with oversubscription, binding would pin several ranks to one core.

On a cluster none of these is needed: launch with ``mpirun`` or ``srun`` directly.
"""

import os
import shutil
import sys


def mpirun_command(np, command, *, mpirun="mpirun", extra=()):
    """The ``mpirun`` argv that runs ``command`` on ``np`` local ranks."""
    if np < 1:
        raise ValueError(f"np must be >= 1, got {np}")
    argv = [mpirun, "-np", str(np)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if np > (os.cpu_count() or 1):
        argv.append("--oversubscribe")
    argv += ["--bind-to", "none", *extra, *command]
    return argv


#: Variables through which a running MPI process (an mpirun rank, or a singleton: a process
#: that called ``MPI_Init`` without a launcher) reaches its own runtime. A new ``mpirun``
#: started with them inherited joins that runtime instead of starting its own, and fails
#: without a word; they are dropped from the environment of every launch we start.
#: Settings that users give (``OMPI_MCA_btl_tcp_if_include`` and the like) are kept.
RUNTIME_VARIABLE_PREFIXES = ("PMIX_", "ORTE_", "OMPI_COMM_WORLD_", "OMPI_APP_CTX_",
                             "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_orte_")


def launch_environment(environ=None):
    """``environ`` (default ``os.environ``) without the variables of a running MPI runtime."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in environ.items()
            if not name.startswith(RUNTIME_VARIABLE_PREFIXES)}


def main(argv=None):
    """``python -m hpctrain.launch -np N [MPIRUN OPTIONS --] COMMAND...``: exec mpirun."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] not in ("-np", "-n") or not argv[1].isdigit():
        sys.exit("usage: python -m hpctrain.launch -np N [MPIRUN OPTIONS --] COMMAND...")
    np, rest = int(argv[1]), argv[2:]
    extra, command = (rest[:rest.index("--")], rest[rest.index("--") + 1:]) \
        if "--" in rest else ((), rest)
    if not command:
        sys.exit("python -m hpctrain.launch: no command to launch")
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("mpirun not found: install Open MPI (scripts/setup does) or put it on PATH")
    full = mpirun_command(np, command, mpirun=mpirun, extra=extra)
    os.execve(mpirun, full, launch_environment())


if __name__ == "__main__":
    main()
