"""Stall watchdog: say which ranks a collective is waiting for, and end a job that is stuck.

A rank that stops calling collectives (stuck in I/O, a deadlock, a dead GPU) leaves every
other rank waiting forever in its next one. Like Horovod's stall check, the watchdog names
the ranks that have not arrived: before each watched collective every rank calls
``arrive(name)``, which sends its sequence number to rank 0 with one small non-blocking send
on a private communicator; a thread on rank 0 collects them. When a collective has been
reached by some ranks for ``warning`` seconds but not by others, rank 0 logs the missing
ranks; after ``timeout`` seconds it logs the same and aborts the job (``MPI_Abort``).

Cost per watched collective: one 8-byte ``Isend`` per rank (a few µs), nothing collective.
It needs ``MPI_THREAD_MULTIPLE`` (mpi4py asks for it by default); without it the watchdog is
off, with a warning, rather than risking a crash.
"""

import logging
import threading
import time

import numpy as np

from . import tags
from .log import logger
from .stalls import StallRule, stalled

LOG = logger()

POLL = 0.05  # s between checks on rank 0
DONE = np.iinfo(np.int64).max  # the sequence number that says "this rank has finished"


class StallWatchdog:
    """Call ``arrive(name)`` on every rank before each watched collective; ``close()`` at
    the end."""

    def __init__(self, comm, warning=60.0, timeout=None, log=None):
        from mpi4py import MPI

        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        threaded = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self.enabled = self.size > 1 and threaded
        if self.size > 1 and not threaded and self.rank == 0:
            LOG.warning("stall watchdog off: MPI is not MPI_THREAD_MULTIPLE")
        self.comm = comm.Dup() if self.enabled else None  # collective: every rank dups
        self.warning, self.timeout = warning, timeout
        self.rule = StallRule(warning, timeout)
        self.log = log             # a callable taking each message, or None: the logger
        self.seq = 0
        self._sends = []
        self._lock = threading.Lock()
        self._arrived = np.zeros(self.size, dtype=np.int64)  # rank 0: last seq per rank
        self._since = {}    # rank 0: seq -> when the first rank reached it
        self._names = {}    # seq -> name, as rank 0 itself called it
        self._stop = threading.Event()
        self._thread = None
        if self.enabled and self.rank == 0:
            self._thread = threading.Thread(target=self._monitor, name="hpctrain-watchdog",
                                            daemon=True)
            self._thread.start()

    def arrive(self, name):
        """This rank is about to enter the next watched collective, called ``name``."""
        self.seq += 1
        if self.enabled:
            self._announce(self.seq, name)

    def close(self):
        """Say this rank is done; rank 0 waits until every rank has, then stops its thread."""
        if not self.enabled:
            return
        self._announce(DONE, "done")
        from mpi4py import MPI

        MPI.Request.Waitall([request for request, _ in self._sends])
        self._sends.clear()
        if self._thread is not None:
            self._thread.join()
        self.comm.Free()
        self.enabled = False

    def stop(self):
        """After a failure: stop watching at once, without waiting for the other ranks.

        ``close`` would wait for every rank to say it is done, and after a failure some never
        will. The private communicator is not freed (its pending messages may never match).
        """
        if not self.enabled:
            return
        self.enabled = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _announce(self, seq, name):
        if self.rank == 0:
            self._names[seq] = name
            self._record(0, seq)
            return
        # Drop completed sends; a pending send's buffer must stay alive until it completes.
        self._sends = [(request, buf) for request, buf in self._sends if not request.Test()]
        buf = np.array([seq], dtype=np.int64)
        self._sends.append((self.comm.Isend(buf, dest=0, tag=tags.WATCHDOG), buf))

    def _record(self, rank, seq):
        with self._lock:
            self._arrived[rank] = seq
            if seq != DONE:
                self._since.setdefault(seq, time.monotonic())

    def _monitor(self):
        from mpi4py import MPI

        buf = np.empty(1, dtype=np.int64)
        status = MPI.Status()
        request = self.comm.Irecv(buf, source=MPI.ANY_SOURCE, tag=tags.WATCHDOG)
        while not self._stop.is_set():
            while request.Test(status):
                self._record(status.Get_source(), int(buf[0]))
                request = self.comm.Irecv(buf, source=MPI.ANY_SOURCE, tag=tags.WATCHDOG)
            with self._lock:
                if (self._arrived == DONE).all():
                    break
                self._check(time.monotonic())
            time.sleep(POLL)
        request.Cancel()
        request.Wait()

    def _check(self, now):
        for seq in sorted(self._since):
            late = np.flatnonzero(self._arrived < seq)
            if len(late) == 0:
                del self._since[seq]
                self.rule.settled(seq)
                continue
            waited = now - self._since[seq]
            # Rank 0 knows the names of the collectives it has reached itself.
            name = self._names.get(seq)
            label = f"{name!r} (collective #{seq})" if name else f"collective #{seq}"
            message = stalled(label, waited, late.tolist(), "reached it")
            if self.rule.give_up(waited):
                self._say(logging.ERROR,
                          f"{message}; aborting (stall timeout {self.timeout:g} s)")
                self.comm.Abort(3)
            if self.rule.warn(seq, waited):
                self._say(logging.WARNING, message)

    def _say(self, level, message):
        if self.log is None:
            LOG.log(level, message)
        else:
            self.log(message)
