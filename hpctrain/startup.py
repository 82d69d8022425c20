"""The start-up bound: a rank that waits too long for the others while its job starts ends,
saying so, instead of waiting for ever.

From ``hvd.init`` until the job is up, a rank waits for every other one: in ``MPI_Init``,
whose exchange of addresses has no failure detection (under ``mpirun --with-ft ulfm`` a rank
that died before it leaves the others there for ever: mpirun no longer ends such a job),
then in the collectives that set up the world, and in an elastic job in the first sync of
the state (``hvd.elastic.run``), after which rank 0 says the start is up
(:func:`hpctrain.elastic.log_up`). Those waits together may last ``HPCTRAIN_START_TIMEOUT_S``
seconds (:func:`timeout`); the rank's own work between them (reading its data, building its
model) does not count. A rank that has waited that long prints one line naming itself, the
wait and the setting, and is ended (SIGKILL): its launcher sees a failed start.

``MPI_Init`` holds Python's GIL: mpi4py calls it without releasing it (a thread of ours
printed nothing while its rank waited 4 s there), so no thread of the rank could end that
wait, and a signal's Python handler would never run. The bound is kept by a watcher
instead: this file, run as a small process of its own by the rank's Python (``-I -S``: the
standard library only, started in tens of milliseconds), which the rank tells through a
pipe when a wait begins and ends. It ends with the rank: when the rank is gone, the pipe
closes.
"""

import contextlib
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
#: of ranks on a parallel file system), and MPI_Init's exchange and the first sync grow with
#: the ranks; the base covers the spread of one node's start on a loaded machine.
BASE_S = 120.0
PER_RANK_S = 0.1
VARIABLE = "HPCTRAIN_START_TIMEOUT_S"

_watch = None       # this process's watcher while its start is not up


def timeout(given, size):
    """The bound, in seconds, at ``size`` ranks: ``given`` (the setting; 0 turns it off)
    or the default."""
    return given if given is not None else BASE_S + PER_RANK_S * size


def begin(given, rank, size):
    """Start bounding this process's start-up, where there is something to bound: more than
    one rank, a bound, and MPI not started yet (a second ``init`` is no start)."""
    global _watch
    bound = timeout(given, size)
    if _watch is not None or size < 2 or bound <= 0 or "mpi4py.MPI" in sys.modules \
            and sys.modules["mpi4py.MPI"].Is_initialized():
        return
    why = f"{VARIABLE}={given:g}" if given is not None else \
        f"the default at np {size}: {BASE_S:g} s + {PER_RANK_S:g} s per rank"
    who = f"rank {rank} of {size} on {socket.gethostname()} (pid {os.getpid()})"
    _watch = subprocess.Popen([sys.executable, "-I", "-S", __file__, str(os.getpid()),
                               repr(bound), who, why], stdin=subprocess.PIPE, close_fds=True)


@contextlib.contextmanager
def waiting(what):
    """While in it, this rank waits for the others (``what``: where), and the time counts
    against the bound."""
    _tell(f"wait {what}")
    try:
        yield
    finally:
        _tell("pause")


def end():
    """The start is up (or this process's start-up is not bounded any more): the watcher
    goes."""
    global _watch
    if _watch is None:
        return
    _tell("end")
    with contextlib.suppress(OSError):
        _watch.stdin.close()
    _watch.wait()
    _watch = None


def _tell(line):
    if _watch is None:
        return
    try:
        _watch.stdin.write(f"{line}\n".encode())
        _watch.stdin.flush()
    except OSError:
        pass        # the watcher has ended this rank, or is ending it


# --- the watcher: a process of its own ------------------------------------------------------

def watch(parent, bound, who, why, commands):
    """Count the time ``parent`` spends in the waits that ``commands`` (a file descriptor:
    lines ``wait WHAT``, ``pause``, ``end``) tells of; past ``bound`` s, say so and SIGKILL
    ``parent``. Returns when told ``end`` or when the pipe closes (the rank is gone)."""
    spent, since, what, pending = 0.0, None, None, b""
    while os.getppid() == parent:
        left = None if since is None else bound - spent - (time.monotonic() - since)
        if left is not None and left <= 0:
            _end_rank(parent, bound, who, why, what)
            return
        # A child the rank forked keeps the pipe open after the rank is gone: the parent is
        # looked at again every second too.
        ready, _, _ = select.select([commands], [], [], min(left or 1.0, 1.0))
        if not ready:
            continue
        chunk = os.read(commands, 4096)
        if not chunk:
            return
        *lines, pending = (pending + chunk).split(b"\n")
        for line in (raw.decode() for raw in lines):
            if line.startswith("wait ") and since is None:
                since, what = time.monotonic(), line[5:]
            elif line == "pause" and since is not None:
                spent, since = spent + time.monotonic() - since, None
            elif line == "end":
                return


def _end_rank(parent, bound, who, why, what):
    os.write(2, (f"[hpctrain] {who}: waited {bound:g} s for the other ranks in start-up "
                 f"({what}): one of them has died or is stuck before it. Ending this rank, "
                 f"whose job cannot start. If the start is only slow, set {VARIABLE} to more "
                 f"seconds (now {why}).\n").encode())
    os.kill(parent, signal.SIGKILL)


if __name__ == "__main__":
    # Only the waits' own signals end it: a Ctrl-C meant for the job reaches the whole
    # process group, and the rank decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.stdin.fileno())
