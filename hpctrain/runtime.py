"""Process-level runtime: which rank we are, one verdict on bad input, and ending the whole
job when one rank fails.

An MPI job in which one rank dies while the others wait in a collective hangs until its
allocation runs out. ``run_guarded`` (and, in a user's script, the hook :func:`guard`
installs) prevents that the way ``python -m mpi4py`` does: an unhandled exception on any
rank prints that rank's traceback and calls ``MPI_Abort`` on ``COMM_WORLD``, which makes the
launcher (mpirun or srun) kill every rank within seconds.

Bad input is different: it is found before work starts, and it is not one rank's failure.
The ranks agree on it in one way: every rank's problem, one collective, the same
:class:`~hpctrain.errors.Verdict` on every rank. :func:`checks` runs a block of local
checks on every rank and ends it with that collective, :func:`agree`;
:func:`agree_with_root` does the same for a value that every rank must share with rank 0;
:func:`common_verdict` returns the verdict for a caller that decides what to do with it.
Rank 0 prints each problem once and every rank exits with status 2 through
``MPI_Finalize``: the same output every run, whichever rank got there first.
"""

import contextlib
import io
import os
import socket
import sys
import time
import traceback

from .errors import UsageError, Verdict

#: Environment variables in which launchers publish the rank, in the order we trust them.
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


#: Where launchers publish the number of ranks, in the same order.
SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS")


def launcher_rank():
    """This process's rank as the launcher announced it, before MPI is initialised (0 alone)."""
    return _announced(RANK_VARIABLES, 0)


def launcher_size():
    """The number of ranks as the launcher announced it, before MPI is initialised (1 alone)."""
    return _announced(SIZE_VARIABLES, 1)


def _announced(names, alone):
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return alone


def mpi_initialized():
    """True when mpi4py has initialised MPI in this process and not finalised it."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()


def common_verdict(comm, problem=None):
    """Collective: tell every rank of ``comm`` every rank's ``problem`` (a ``UsageError``, a
    message or None); return the same :class:`Verdict` on every rank if any rank has one,
    else None.

    Synchronisation point: one ``allgather`` of a short message (or None) per rank.
    """
    found = comm.allgather(None if problem is None else str(problem))
    problems = {}  # message -> the ranks that found it, in rank order
    for rank, message in enumerate(found):
        if message is not None:
            problems.setdefault(message, []).append(rank)
    return Verdict(problems.items(), comm.Get_size(), comm.Get_rank()) if problems else None


def agree(comm, problem=None):
    """Collective: :func:`common_verdict`, raised on every rank if any rank has a problem.

    Synchronisation point: one ``allgather``, as :func:`common_verdict`.
    """
    verdict = common_verdict(comm, problem)
    if verdict is not None:
        raise verdict


def differ_from_root(comm, value):
    """Collective: every rank's ``value`` (a list in rank order) and the ranks whose value
    differs from rank 0's, the same on every rank.

    Synchronisation point: one ``allgather`` of ``value`` per rank.
    """
    values = comm.allgather(value)
    return values, [rank for rank, other in enumerate(values) if other != values[0]]


def agree_with_root(comm, value, problem):
    """Collective: rank 0's ``value``, once every rank of ``comm`` holds an equal one;
    otherwise the same :class:`Verdict` on every rank, ``problem(rank 0's value)`` found by
    the ranks whose value differs (the verdict names them).

    For what every rank must share before it may go on (a start position, a model's
    layout): a rank that went on with another would hang or mix data in a later collective.
    Synchronisation point: one ``allgather``, as :func:`differ_from_root`.
    """
    values, differ = differ_from_root(comm, value)
    if differ:
        raise Verdict([(problem(values[0]), differ)], comm.Get_size(), comm.Get_rank())
    return values[0]


@contextlib.contextmanager
def checks(comm):
    """Run a block of checks on every rank of ``comm``, then :func:`agree` on their outcome.

    The block must make no collective call: a rank whose check raises ``UsageError`` leaves
    it early, and the ranks meet in the one ``allgather`` at its end. Any other exception is
    a real failure and goes on (under the guard it ends the job).
    """
    try:
        yield
    except Verdict:
        raise
    except UsageError as exc:
        agree(comm, exc)
        raise  # not reached: agree raised the Verdict that includes exc
    agree(comm)


def run_guarded(func, *args, **kwargs):
    """Call ``func``; if it fails on this rank, report it and end the whole job (see
    :func:`end_job`). A ``SystemExit`` with status 0 or None goes on as it is."""
    try:
        return func(*args, **kwargs)
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            raise
        end_job(exc)
    except BaseException as exc:  # noqa: B036 - every failure must end the job
        end_job(exc)


def end_job(exc):
    """Report ``exc``, this rank's failure, and end the job; does not return.

    - ``Verdict`` (bad input that every rank knows of): rank 0 prints each problem once,
      every rank exits with status 2 through ``MPI_Finalize``.
    - ``UsageError`` found by this rank alone: its message (no traceback), exit status 2.
    - ``SystemExit`` with a non-zero status: that status.
    - any other exception, ``KeyboardInterrupt`` included: the traceback, exit status 1
      (130 for an interrupt).

    Except for a ``Verdict``, while MPI is initialised and the world has more than one rank
    the exit goes through ``MPI_Abort``, so that no other rank is left waiting in a
    collective for this one.
    """
    if isinstance(exc, Verdict):
        _report_verdict(exc)
        sys.exit(exc.exit_code)
    if isinstance(exc, SystemExit):
        code = exc.code
        if not isinstance(code, int):
            _report(f"{code}\n", 1)
            code = 1
    elif isinstance(exc, UsageError):
        code = exc.exit_code
        _report(f"error: {exc}\n", code)
    elif isinstance(exc, KeyboardInterrupt):
        code = 130
        _report("interrupted\n", code)
    else:
        code = 1
        _report("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), code)
    _exit_job(code)


#: Set to ``0`` to keep :func:`guard` from replacing ``sys.excepthook``.
GUARD_VARIABLE = "HPCTRAIN_ABORT_ON_ERROR"


def guard():
    """Make an uncaught exception in this process end the whole job, as under ``python -m
    hpctrain``: ``hpctrain.torch.init()`` calls it for users' own scripts.

    The exception's traceback is printed with this rank's name, then ``MPI_Abort`` ends
    every rank; without it the other ranks would wait in their next collective until the
    launcher is killed. ``HPCTRAIN_ABORT_ON_ERROR=0`` leaves ``sys.excepthook`` alone.
    Returns whether the hook is installed.
    """
    if os.environ.get(GUARD_VARIABLE, "1").strip() == "0":
        return False
    if sys.excepthook is not _ending_hook:
        _ending_hook.previous = sys.excepthook
        sys.excepthook = _ending_hook
    return True


def _ending_hook(kind, exc, tb):
    alone = not mpi_initialized() or sys.modules["mpi4py.MPI"].COMM_WORLD.Get_size() == 1
    if alone and isinstance(exc, UsageError):
        # Bad input: its message, and status 2 as under python -m hpctrain. A hook cannot
        # set the status by SystemExit, so MPI (if started) is finalised and the process
        # ends here.
        _report(f"error: {exc}\n", exc.exit_code)
        if mpi_initialized():
            sys.modules["mpi4py.MPI"].Finalize()
        os._exit(exc.exit_code)
    if alone:
        _ending_hook.previous(kind, exc, tb)
    elif isinstance(exc, Verdict):
        # Every rank raised it and ends normally (status 1, the interpreter's): rank 0 says
        # it once. A SystemExit raised in a hook would not set the status.
        _report_verdict(exc)
    else:
        end_job(exc)


_ending_hook.previous = sys.__excepthook__


def _report_verdict(verdict):
    if verdict.rank == 0:
        sys.stdout.flush()
        sys.stderr.write("".join(f"error: {line}\n" for line in verdict.lines()))
        sys.stderr.flush()


def _where():
    rank, size = launcher_rank(), None
    if mpi_initialized():
        comm = sys.modules["mpi4py.MPI"].COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()
    world = f" of {size}" if size else ""
    return f"rank {rank}{world} on {socket.gethostname()} (pid {os.getpid()})"


def stamp(seconds=None):
    """``seconds`` (default: now) as the failure reports write the time: ``2026-11-27
    08:30:01.123 UTC`` (the launchers read it back to find the first rank that failed)."""
    seconds = time.time() if seconds is None else seconds
    whole = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))
    return f"{whole}.{int(seconds % 1 * 1000):03d} UTC"


def _report(text, code):
    # The header says what the launchers' root-cause block needs (hpctrain.launch.output):
    # the rank, its host and pid, the status it ends with, and when.
    when = stamp()
    # torch.distributed's excepthook calls this one with sys.stderr swapped for a buffer that
    # it prints only once the hook returns, which an abort never does: write past it.
    stream = sys.__stderr__ if isinstance(sys.stderr, io.StringIO) else sys.stderr
    sys.stdout.flush()
    stream.write(f"[hpctrain] {_where()} failed (exit status {code}) at {when}:\n{text}")
    stream.flush()


def _exit_job(code):
    if mpi_initialized():
        comm = sys.modules["mpi4py.MPI"].COMM_WORLD
        if comm.Get_size() > 1:
            comm.Abort(code)  # does not return: the launcher ends every rank
    sys.exit(code)
