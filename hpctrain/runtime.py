"""Process-level runtime: which rank we are, and ending the whole job when one rank fails.

An MPI job in which one rank dies while the others wait in a collective hangs until its
allocation runs out. ``run_guarded`` prevents that the way ``python -m mpi4py`` does: an
unhandled exception on any rank prints that rank's traceback and calls ``MPI_Abort`` on
``COMM_WORLD``, which makes the launcher (mpirun or srun) kill every rank within seconds.
"""

import os
import socket
import sys
import traceback

from .errors import UsageError

#: Environment variables in which launchers publish the rank, in the order we trust them.
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def launcher_rank():
    """This process's rank as the launcher announced it, before MPI is initialised (0 alone)."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def mpi_initialized():
    """True when mpi4py has initialised MPI in this process and not finalised it."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()


def run_guarded(func, *args, **kwargs):
    """Call ``func``; if it fails on this rank, report it and end the whole job.

    - ``UsageError``: its message alone (no traceback), exit status 2.
    - ``SystemExit`` with a non-zero status: that status.
    - any other exception, ``KeyboardInterrupt`` included: the traceback, exit status 1
      (130 for an interrupt).

    While MPI is initialised and the world has more than one rank, the exit goes through
    ``MPI_Abort`` so that no other rank is left waiting in a collective for this one.
    """
    try:
        return func(*args, **kwargs)
    except SystemExit as exc:
        code = exc.code
        if code is None or code == 0:
            raise
        if not isinstance(code, int):
            _report(f"{code}\n")
            code = 1
        _exit_job(code)
    except UsageError as exc:
        _report(f"error: {exc}\n")
        _exit_job(exc.exit_code)
    except KeyboardInterrupt:
        _report("interrupted\n")
        _exit_job(130)
    except BaseException:  # noqa: B036 - every failure must end the job, not only Exceptions
        _report(traceback.format_exc())
        _exit_job(1)


def _where():
    rank, size = launcher_rank(), None
    if mpi_initialized():
        comm = sys.modules["mpi4py.MPI"].COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()
    world = f" of {size}" if size else ""
    return f"rank {rank}{world} on {socket.gethostname()} (pid {os.getpid()})"


def _report(text):
    sys.stdout.flush()
    sys.stderr.write(f"[hpctrain] {_where()} failed:\n{text}")
    sys.stderr.flush()


def _exit_job(code):
    if mpi_initialized():
        comm = sys.modules["mpi4py.MPI"].COMM_WORLD
        if comm.Get_size() > 1:
            comm.Abort(code)  # does not return: the launcher ends every rank
    sys.exit(code)
