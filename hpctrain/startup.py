"""The start-up bound: a rank that waits too long for the others while its job starts ends,
saying so, instead of waiting for ever.

From ``hvd.init`` until the job is up, a rank waits for every other one: in ``MPI_Init``,
whose exchange of addresses has no failure detection (under ``mpirun --with-ft ulfm`` a rank
that died before it leaves the others there for ever: mpirun no longer ends such a job),
then in the collectives that set up the world, and in an elastic job in the first sync of
the state (``hvd.elastic.run``), after which rank 0 says the start is up
(:func:`hpctrain.elastic_job.log_up`). Those waits together may last ``HPCTRAIN_START_TIMEOUT_S``
seconds (:func:`timeout`); the rank's own work between them (reading its data, building its
model) does not count. A rank that has waited that long prints one line naming itself, the
wait and the setting, then its Python traceback, and exits with status 1.

``MPI_Init`` holds Python's GIL: mpi4py calls it without releasing it (a thread of ours
printed nothing while its rank waited 4 s there), so no Python thread of the rank can end
that wait, nor can a signal's Python handler. Two things that need no GIL keep the bound:

- ``faulthandler``'s timer, a C thread of the rank, which prints the rank's traceback and
  exits with status 1. An exit status, not a signal: under ``--with-ft ulfm``, Open MPI 5's
  mpirun exits 0 when every rank was killed by a signal (seen here), and the elastic launcher
  would take the job for finished;
- a watcher, this file run as a small process of the rank (``-I -S``: the standard library
  only, tens of milliseconds), told through a pipe when each wait must end; at that moment
  it prints the line that says why, one second before the timer ends the rank. It ends with
  the rank: when the rank is gone, the pipe closes.

The timer is the process's only ``faulthandler.dump_traceback_later``: a script's own is
cancelled by the start-up's waits.
"""

import contextlib
import faulthandler
import os
import select
import signal
import socket
import subprocess
import sys
import time

#: The bound at np ranks is ``BASE_S + PER_RANK_S * np`` unless ``HPCTRAIN_START_TIMEOUT_S``
#: says otherwise. A rank's wait in MPI_Init includes every other rank's start before it
#: (Python and torch imported from a file system that serves them all: minutes at thousands
#: of ranks on a parallel file system), and MPI_Init's exchange and the first sync (rank 0
#: reads the commit, then broadcasts the state) grow with the ranks; the base covers the
#: spread of the start of one node's ranks on a loaded machine.
BASE_S = 120.0
PER_RANK_S = 0.1
VARIABLE = "HPCTRAIN_START_TIMEOUT_S"
#: Seconds between the watcher's line and the timer's exit: the line comes first.
SAY_FIRST_S = 1.0


class _Bound:
    """This process's start-up bound while its start is not up."""

    def __init__(self, bound, watcher):
        self.left, self.watcher = bound, watcher

    def tell(self, line):
        if self.watcher is None:
            return
        try:
            self.watcher.stdin.write(f"{line}\n".encode())
            self.watcher.stdin.flush()
        except OSError:
            pass        # the watcher is gone: the timer alone ends the rank


_bound = None


def timeout(given, size):
    """The bound, in seconds, at ``size`` ranks: ``given`` (the setting; 0 turns it off)
    or the default."""
    return given if given is not None else BASE_S + PER_RANK_S * size


def begin(given, rank, size):
    """Start bounding this process's start-up, where there is something to bound: more than
    one rank, a bound, and MPI not started yet (a second ``init`` is no start)."""
    global _bound
    bound = timeout(given, size)
    started = "mpi4py.MPI" in sys.modules and sys.modules["mpi4py.MPI"].Is_initialized()
    if _bound is not None or size < 2 or bound <= 0 or started:
        return
    why = f"{VARIABLE}={given:g}" if given is not None else \
        f"the default at np {size}: {BASE_S:g} s + {PER_RANK_S:g} s per rank"
    who = f"rank {rank} of {size} on {socket.gethostname()} (pid {os.getpid()})"
    try:
        watcher = subprocess.Popen([sys.executable, "-I", "-S", __file__, str(os.getpid()),
                                    f"{bound:g}", who, why], stdin=subprocess.PIPE)
    except OSError:
        watcher = None      # no line to say why; the timer still ends the rank
    _bound = _Bound(bound, watcher)


@contextlib.contextmanager
def waiting(what):
    """While in it, this rank waits for the others (``what``: where), and the time counts
    against the bound."""
    if _bound is None:
        yield
        return
    began = time.monotonic()
    _bound.tell(f"{began + _bound.left!r} {what}")
    # To the file descriptor: a script may have replaced sys.stderr by an object without one.
    faulthandler.dump_traceback_later(_bound.left + SAY_FIRST_S, exit=True, file=2)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        _bound.tell("pause")
        _bound.left -= time.monotonic() - began


def end():
    """The start is up (or this process's start-up is not bounded any more): the watcher
    goes."""
    global _bound
    if _bound is None:
        return
    if _bound.watcher is not None:
        with contextlib.suppress(OSError):
            _bound.watcher.stdin.close()
        _bound.watcher.wait()
    _bound = None


# --- the watcher: a process of its own ------------------------------------------------------

def watch(parent, bound, who, why, commands):
    """Print why ``parent`` ends when a wait outlasts its deadline: ``commands`` (a file
    descriptor) gives lines ``DEADLINE WHAT`` (``time.monotonic()``, which every process of
    the machine shares) and ``pause``. Returns when the pipe closes: the rank is up, or
    gone."""
    deadline, what, pending = None, None, b""
    while os.getppid() == parent:
        if deadline is not None and time.monotonic() >= deadline:
            os.write(2, (f"[hpctrain] {who}: waited {bound:g} s for the other ranks in "
                         f"start-up ({what}): one of them has died or is stuck before it. "
                         f"Ending this rank, whose job cannot start. If the start is only "
                         f"slow, set {VARIABLE} to more seconds (now {why}).\n").encode())
            deadline = None
        # A child the rank forked keeps the pipe open after the rank is gone: the parent is
        # looked at again every second.
        left = 1.0 if deadline is None else min(max(deadline - time.monotonic(), 0), 1.0)
        ready, _, _ = select.select([commands], [], [], left)
        if not ready:
            continue
        chunk = os.read(commands, 4096)
        if not chunk:
            return
        *lines, pending = (pending + chunk).split(b"\n")
        for line in (raw.decode() for raw in lines):
            if line == "pause":
                deadline = None
            else:
                at, _, what = line.partition(" ")
                deadline = float(at)


if __name__ == "__main__":
    # A Ctrl-C meant for the job reaches the whole process group: the rank decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.stdin.fileno())
