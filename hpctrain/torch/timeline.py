"""A Chrome trace of what the communication engine does: Horovod's timeline.

    from hpctrain.torch import timeline

    timeline.start("/tmp/trace.json", rank=hvd.rank(), epoch=timeline.agree_epoch(comm))
    ...                                   # the engine calls timeline.current().begin/end
    timeline.stop()

The file is the JSON array of the Trace Event Format, which chrome://tracing and Perfetto
(ui.perfetto.dev) open. Its layout is Horovod's (``horovod/common/timeline.cc``): one
*process* per operation name (a tensor's name), in order of first appearance, holding that
operation's nested phases: ``NEGOTIATE_ALLREDUCE`` (waiting for every rank to ask), then
the data phase ``ALLREDUCE`` (``ALLGATHER``, ...) with ``MEMCPY_IN_FUSION_BUFFER`` and
``MEMCPY_OUT_FUSION_BUFFER`` inside it. Process 0 holds the instants (``CYCLE_START`` when
cycles are marked) and the wall-clock time of the epoch. The thread id of every event is
the rank, so that the files of several ranks, merged, show one row per rank under each
operation.

As in Horovod only rank 0 writes a file; the other ranks' timelines do nothing, unless the
path holds ``{rank}``, which gives every rank a file of its own. Every rank's timestamps are
microseconds since a common epoch (:func:`agree_epoch`), so such files line up.

The file is valid JSON after every flush (each write ends the array and the next one
overwrites that end), so a process that dies keeps a readable trace of all but its last
second; :meth:`Timeline.close`, called at exit if nobody did, writes the rest. Events are
buffered in memory and written by whichever thread records them once a second, or every
:data:`FLUSH_EVENTS` events: the engine thread pays a few milliseconds then, nothing between.
"""

import atexit
import json
import logging
import threading
import time
from contextlib import contextmanager

from ..errors import UsageError

#: Buffered events that trigger a write, and the seconds after which any do.
FLUSH_EVENTS = 1000
FLUSH_SECONDS = 1.0
#: The instant :meth:`Timeline.mark_cycle` records.
CYCLE_START = "CYCLE_START"

log = logging.getLogger(__name__)


def agree_epoch(comm):
    """The common epoch: this rank's ``time.perf_counter()`` just after a barrier over
    ``comm``, so every rank's clock starts within a barrier's skew of the others' (closer
    than hosts' wall clocks agree).

    Synchronisation point: ``comm.Barrier()``; every rank of ``comm`` must call it.
    """
    comm.Barrier()
    return time.perf_counter()


class NullTimeline:
    """The timeline when none is started, and on the ranks that write none: every method
    does nothing, at the cost of a call."""

    enabled = False
    path = None

    def begin(self, op_name, phase, ts=None, args=None):
        """Nothing."""

    def end(self, op_name, phase, ts=None, args=None):
        """Nothing."""

    def instant(self, name, ts=None, args=None):
        """Nothing."""

    def mark_cycle(self):
        """Nothing."""

    @contextmanager
    def span(self, op_name, phase, args=None):
        """Nothing, around the ``with`` block."""
        yield

    def flush(self):
        """Nothing."""

    def close(self):
        """Nothing."""


NULL = NullTimeline()


class Timeline(NullTimeline):
    """A Chrome trace file written by rank 0 (by every rank if ``path`` holds ``{rank}``).

    ``path``: the file (``None``: write nothing); ``rank``: this process's rank, the thread
    id of its events; ``epoch``: the ``time.perf_counter()`` reading that timestamps count
    from, the same moment on every rank (:func:`agree_epoch`; ``None``: now);
    ``mark_cycles``: whether :meth:`mark_cycle` records an instant.

    Thread-safe: any thread may record; one lock guards the buffer and the file. Opening
    the file raises :class:`~hpctrain.errors.UsageError` if it cannot be written; a later
    write error stops the timeline with a warning rather than failing the engine.
    """

    def __init__(self, path, rank=0, epoch=None, mark_cycles=False):
        self.rank = rank
        self.epoch = time.perf_counter() if epoch is None else epoch
        self.mark_cycles = mark_cycles
        self.path = None if path is None else str(path).replace("{rank}", str(rank))
        self.enabled = path is not None and (rank == 0 or "{rank}" in str(path))
        self._lock = threading.Lock()
        self._pending = []      # event dicts not yet written
        self._pids = {}         # operation name -> process id (1, 2, ...)
        self._open = {}         # operation name -> the phases begun and not ended
        self._last_write = time.monotonic()
        self._file = None
        if self.enabled:
            self._open_file()

    def _open_file(self):
        try:
            self._file = open(self.path, "wb")
        except OSError as error:
            self.enabled = False
            raise UsageError(f"cannot write the timeline to {self.path}: {error.strerror}; "
                             f"give a file in a writable directory") from None
        wall = time.time() - (time.perf_counter() - self.epoch)
        header = [self._metadata(0, "process_name", {
                      "name": "timeline", "start_time_since_epoch_in_micros": round(wall * 1e6)}),
                  self._metadata(0, "process_sort_index", {"sort_index": 0})]
        self._file.write(b"[\n" + _encode(header))
        self._end = self._file.tell()   # where the next events go, over the closing "]"
        self._file.write(b"\n]\n")
        self._file.flush()
        atexit.register(self.close)

    def _metadata(self, pid, kind, args):
        return {"name": kind, "ph": "M", "pid": pid, "tid": self.rank, "args": args}

    def _micros(self, ts):
        return round(((time.perf_counter() if ts is None else ts) - self.epoch) * 1e6, 3)

    def begin(self, op_name, phase, ts=None, args=None):
        """Open ``phase`` (``"NEGOTIATE_ALLREDUCE"``, ``"ALLREDUCE"``, ...) of the operation
        ``op_name``, inside the phases of it already open. ``ts``: a ``time.perf_counter()``
        reading (``None``: now); ``args``: a JSON-able dict shown with the event."""
        if not self.enabled:
            return
        with self._lock:
            pid = self._pids.get(op_name) or self._new_process(op_name)
            self._open.setdefault(op_name, []).append(phase)
            self._record({"ph": "B", "name": phase, "pid": pid, "tid": self.rank,
                          "ts": self._micros(ts)}, args)

    def end(self, op_name, phase, ts=None, args=None):
        """Close ``phase`` of ``op_name``, and first any phase opened inside it and still
        open (as Horovod's end of an operation closes its activity). ``ValueError`` if
        ``phase`` is not open. ``ts`` and ``args`` as for :meth:`begin`."""
        if not self.enabled:
            return
        with self._lock:
            stack = self._open.get(op_name, [])
            if phase not in stack:
                opened = ", ".join(map(repr, stack)) or "none"
                raise ValueError(f"timeline: end of phase {phase!r} of {op_name!r}, which is "
                                 f"not open (open phases: {opened}); end only what begin "
                                 f"opened")
            micros = self._micros(ts)
            pid = self._pids[op_name]
            while stack:
                inner = stack.pop()
                self._record({"ph": "E", "name": inner, "pid": pid, "tid": self.rank,
                              "ts": micros}, args if inner == phase else None)
                if inner == phase:
                    break
            if not stack:
                del self._open[op_name]

    def instant(self, name, ts=None, args=None):
        """A moment across the whole trace (process 0), e.g. the start of a cycle."""
        if not self.enabled:
            return
        with self._lock:
            self._record({"ph": "i", "name": name, "pid": 0, "tid": self.rank, "s": "g",
                          "ts": self._micros(ts)}, args)

    def mark_cycle(self):
        """The instant ``CYCLE_START``, if the timeline marks cycles (the engine calls this
        once per cycle of its loop)."""
        if self.mark_cycles:
            self.instant(CYCLE_START)

    @contextmanager
    def span(self, op_name, phase, args=None):
        """``begin`` before the ``with`` block and ``end`` after it, even if it raises."""
        self.begin(op_name, phase)
        try:
            yield
        finally:
            self.end(op_name, phase, args=args)

    def flush(self):
        """Write the buffered events now; the file is valid JSON after it."""
        with self._lock:
            self._write()

    def close(self):
        """End every phase still open, write everything and close the file. A second call,
        or a call on a rank that writes nothing, does nothing."""
        with self._lock:
            if self._file is None:
                return
            micros = self._micros(None)
            for op_name, stack in self._open.items():
                for phase in reversed(stack):
                    self._record({"ph": "E", "name": phase, "pid": self._pids[op_name],
                                  "tid": self.rank, "ts": micros}, None, flush=False)
            self._open.clear()
            self._write()
            if self._file is not None:
                self._file.close()
                self._file = None
            self.enabled = False
        atexit.unregister(self.close)

    def _new_process(self, op_name):
        pid = len(self._pids) + 1
        self._pids[op_name] = pid
        self._pending += [self._metadata(pid, "process_name", {"name": op_name}),
                          self._metadata(pid, "process_sort_index", {"sort_index": pid}),
                          self._metadata(pid, "thread_name", {"name": f"rank {self.rank}"})]
        return pid

    def _record(self, event, args, flush=True):
        if args:
            event["args"] = args
        self._pending.append(event)
        if flush and (len(self._pending) >= FLUSH_EVENTS
                      or time.monotonic() - self._last_write >= FLUSH_SECONDS):
            self._write()

    def _write(self):
        # Called with the lock held.
        self._last_write = time.monotonic()
        if not self._pending or self._file is None:
            return
        events, self._pending = self._pending, []
        try:
            self._file.seek(self._end)
            self._file.write(b",\n" + _encode(events))
            self._end = self._file.tell()
            self._file.write(b"\n]\n")
            self._file.flush()
        except (OSError, TypeError, ValueError) as error:
            # A full disk or an args dict that is not JSON: lose the trace, not the job.
            log.warning("timeline %s: stopped writing after an error: %s", self.path, error)
            self.enabled = False
            self._file.close()
            self._file = None


def _encode(events):
    return ",\n".join(json.dumps(e, separators=(",", ":")) for e in events).encode()


class TimelineControl:
    """Which timeline is active: what ``hvd.start_timeline`` and ``hvd.stop_timeline``
    change and the engine reads (:meth:`current`). The module's functions use one of these;
    a world may hold its own."""

    def __init__(self):
        self._lock = threading.Lock()
        self._active = NULL

    def start(self, path, mark_cycles=False, rank=0, epoch=None):
        """Start writing to ``path`` (see :class:`Timeline`); return the timeline. A
        timeline already writing is closed first, unless it writes ``path`` already: then
        only ``mark_cycles`` changes (as Horovod does). Not collective; pass every rank the
        same ``epoch``."""
        with self._lock:
            active = self._active
            wanted = str(path).replace("{rank}", str(rank))
            if active.enabled and active.path == wanted:
                active.mark_cycles = mark_cycles
                return active
            self._active = NULL
            active.close()
            self._active = Timeline(path, rank, epoch, mark_cycles)
            return self._active

    def stop(self):
        """Close the active timeline, if any (harmless without one)."""
        with self._lock:
            active, self._active = self._active, NULL
        active.close()

    def current(self):
        """The active :class:`Timeline`, or the no-op :data:`NULL`."""
        return self._active


CONTROL = TimelineControl()


def start(path, mark_cycles=False, rank=0, epoch=None):
    """Start the timeline of this process (:meth:`TimelineControl.start`); return it."""
    return CONTROL.start(path, mark_cycles, rank, epoch)


def stop():
    """Stop the timeline of this process, if one was started."""
    CONTROL.stop()


def current():
    """The active timeline of this process, or one that does nothing."""
    return CONTROL.current()
