"""The communication thread: operations are paired across ranks by name, then run in one order.

Horovod lets ranks issue their collectives in any order: an operation runs once every rank
of its process set has asked for the same name. The engine does the same with one thread
per rank and one *negotiation* per cycle over the world's private communicator:

1. the thread takes every request queued on this rank since the last cycle;
2. ``Iallgather`` of how many bytes of requests each rank has (polled with short sleeps,
   so that a thread waiting for a slow rank does not spin a core), then, only if any rank
   has some, ``Allgatherv`` of the pickled requests themselves;
3. every rank adds the same requests to the same table, in the same order (rank order,
   then submission order), so every rank finds the same operations ready, in the same
   order, and runs them one after another: no two ranks can wait in different collectives;
4. an operation whose ranks asked with different signatures (shape, dtype, op, root, ...)
   fails on every rank that asked, with what each rank passed; a name already in flight
   on this rank is refused at once, before it is queued.

Operations asked for every step under the same name (a ``DistributedOptimizer``'s buckets)
are *cached*, as Horovod's response cache: once such an operation has run with the same
signature from every rank of its set, every rank gives it the same number, and a later
request of that name and signature is announced by one bit of a word appended to the
``Iallgather`` of step 2 instead of by the ``Allgatherv``. A cycle in which every request is
cached is then one small collective instead of two, with nothing pickled (docs/training.md
measures what that saves, and where it does not). The cache is filled and read only on the
communication thread, from what every rank gathered alike, so every rank numbers alike.

Joined ranks (:func:`hpctrain.torch.join`) count as having asked for every allreduce, which
they join with zeros; other operations fail on every rank while a rank has joined. A
``shutdown`` from any rank ends every rank's thread after the cycle that carries it, and
every operation still waiting fails there with :class:`HorovodInternalError`, as in
Horovod: no rank is left waiting for one that has gone.

A rank that dies is reported by an MPI with fault tolerance (ULFM; any other MPI ends the
job): the first rank to hear of it revokes every communicator of the world (the ``revoke``
given to the engine), so that every survivor's operation in flight, on any of them, fails
within moments instead of waiting for a rank that has gone or moved on; every operation of
this rank then fails with :class:`ProcessFailure`, after which ``hvd.elastic.run`` shrinks
the world and goes on (:mod:`hpctrain.torch.elastic`).

Threads: the callers' threads touch only ``submit``, ``join`` and ``close`` (the queue, and
``_mine`` and ``_ended`` under ``_lock``); everything else is the communication thread's.
"""

import os
import pickle
import queue
import sys
import threading
import time
from collections import OrderedDict

import numpy as np

#: Seconds between negotiations (``HPCTRAIN_CYCLE_TIME_MS``); see :meth:`Engine._take`.
CYCLE_S = float(os.environ.get("HPCTRAIN_CYCLE_TIME_MS", "1")) / 1000
#: Seconds between polls of a negotiation that other ranks have not joined yet.
POLL_S = 0.0001
#: Seconds every rank must have been blocked on operations no other rank asked for before
#: they all fail as a deadlock (``HPCTRAIN_DEADLOCK_S``).
DEADLOCK_S = float(os.environ.get("HPCTRAIN_DEADLOCK_S", "2"))
#: Tests of a negotiation before the thread starts sleeping between them.
SPINS = 200
#: The queue of requests from the callers' threads to the communication thread. Not
#: ``queue.SimpleQueue``: in CPython 3.11 its ``get(timeout=t)`` can wait for ever when the
#: thread is preempted for longer than ``t`` at the wrong moment (its recomputed timeout goes
#: negative, which means "no timeout"), and the engine waits with timeouts of a cycle or
#: less on a machine where ranks outnumber cores. ``queue.Queue`` checks for that.
Inbox = queue.Queue
#: Operations the cache numbers at most (announced by a bit each: 64 per int64 word).
CACHE_SIZE = 1024
#: Seconds an operation may wait for other ranks before rank 0 names the missing ones
#: (``HPCTRAIN_STALL_CHECK_S``; 0 turns the warning off), as Horovod's stall inspector.
STALL_S = float(os.environ.get("HPCTRAIN_STALL_CHECK_S", "60"))


class HorovodInternalError(RuntimeError):
    """An operation failed on every rank that asked for it (mismatch, shutdown, join)."""


class ProcessFailure(HorovodInternalError):
    """A rank of the world died (reported by an MPI with fault tolerance): raised by every
    survivor's pending and later operations until ``hvd.elastic.run`` shrinks the world."""


def process_failure(exc):
    """True when ``exc`` is MPI's report that a rank died, or that a communicator was revoked
    because one did. Only an MPI with fault tolerance reports these (without it the error
    classes are all ``ERR_UNKNOWN``, which this does not take for one)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not isinstance(exc, mpi.Exception):
        return False
    classes = {mpi.ERR_PROC_FAILED, mpi.ERR_PROC_FAILED_PENDING, mpi.ERR_REVOKED}
    return exc.Get_error_class() in classes - {mpi.ERR_UNKNOWN}


class Waiters:
    """How many of this rank's threads are blocked waiting for an operation; told to the
    other ranks in every negotiation, so that a deadlock can be recognised."""

    def __init__(self):
        self.count = 0
        self._lock = threading.Lock()

    def wait(self, event):
        """``event.wait()``, counted."""
        with self._lock:
            self.count += 1
        try:
            event.wait()
        finally:
            with self._lock:
                self.count -= 1


class Handle:
    """One operation of this rank: ``wait()`` returns its result or raises its error."""

    __slots__ = ("result", "error", "done", "waiters")

    def __init__(self):
        self.result = self.error = self.waiters = None
        self.done = threading.Event()

    def wait(self):
        """Block until the operation has run; return its result or raise its error."""
        if not self.done.is_set():
            if self.waiters is None:
                self.done.wait()
            else:
                self.waiters.wait(self.done)
        if self.error is not None:
            raise self.error
        return self.result

    def finish(self, result=None, error=None):
        """Complete the operation (called on the communication thread)."""
        self.result, self.error = result, error
        self.done.set()


class Request:
    """This rank's side of one operation.

    ``signature``: what every rank must pass identically (compared across ranks);
    ``info``: what may differ and the others need (an allgather's first dimension, an
    alltoall's splits); ``describe``: the call in words, for error messages; ``run(comm,
    infos)``: the data phase on the communication thread, over the process set's
    communicator, given every member's ``info`` in the set's rank order (ranks that joined
    take part through the engine's ``joined_runs``). A request whose signature is
    ``INVALID`` had bad arguments here: the others fail with this rank's reason instead of
    waiting for it. ``repeats``: the same name and signature will be asked for again and
    again (gradient buckets): worth a number in the cache (see the module docstring).
    """

    __slots__ = ("set_id", "name", "signature", "info", "describe", "run", "handle", "repeats")

    def __init__(self, set_id, name, signature, describe, run, info=None, repeats=False):
        self.set_id, self.name, self.signature = set_id, name, signature
        self.info, self.describe, self.run = info, describe, run
        self.repeats = repeats and info is None and signature is not INVALID
        self.handle = Handle()

    @property
    def key(self):
        """The (process set, name) pair that pairs this request with the other ranks'."""
        return (self.set_id, self.name)


INVALID = ("invalid",)


def _ranks(ranks):
    return ", ".join(map(str, sorted(ranks)))


def _label(name, signature):
    """How the timeline shows an operation: named by its kind, as Horovod's."""
    return f"{signature[0]}.{name}" if name.startswith("noname.") else name


class _Entry:
    """One operation in the table: which ranks asked, with what."""

    __slots__ = ("signatures", "infos", "describes", "since", "repeats")

    def __init__(self):
        self.signatures, self.infos, self.describes = {}, {}, {}
        self.since = time.monotonic()
        self.repeats = True     # every rank that asked said it repeats, or came from the cache


class _Cached:
    """A numbered operation of the cache: its number, signature and every rank's description."""

    __slots__ = ("number", "signature", "describes")

    def __init__(self, number, signature, describes):
        self.number, self.signature, self.describes = number, signature, describes


class Engine:
    """The negotiating communication thread of one world (see the module docstring).

    ``comm``: the world's private communicator, used only by this thread; ``sets``: the
    live process sets by id (this rank's communicator of each, ``None`` where it is not a
    member) — read by the thread, so it is changed only by operations that run there.
    """

    def __init__(self, comm, sets, joined_runs, revoke=None):
        self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()
        self.sets = sets
        self.joined_runs = joined_runs      # kind -> run(comm, signature) for a joined rank
        self.revoke = revoke                # revoke() every communicator, after a death
        self.timeline = None            # set by hvd.start_timeline
        self._queue = Inbox()
        self._mine = {}                 # key -> Request of this rank, submitted, not yet run
        self._table = OrderedDict()     # key -> _Entry, the same on every rank
        self._cache = {}                # key -> _Cached, the same on every rank
        self._numbered = []             # the cache's keys by number
        self._joined = {}               # rank -> order of joining (the same on every rank)
        self._join_handle = None
        self._stalled = set()
        self._started = 0.0             # when the last negotiation began (monotonic)
        self._waiters = Waiters()
        self._blocked = [False] * self.size     # per rank, from the last negotiation
        self._clock = 0.0               # rank 0's clock at the last negotiation (seconds)
        self._quiet_since = None        # rank 0's clock when every rank became blocked
        self._stop = threading.Event()
        self._lock = threading.Lock()   # _ended and the queue's last puts against _end
        self._ended = None              # why operations fail now (None while running)
        self._failure = HorovodInternalError
        self._thread = threading.Thread(target=self._serve, name="hpctrain-comm", daemon=True)
        self._thread.start()

    # ----- the caller's side ----------------------------------------------------------------

    def submit(self, request):
        """Queue ``request``; return its :class:`Handle`. ``ValueError`` (here, before
        anything is queued) if this rank already has an operation of that name in flight."""
        # Under the lock: a request queued after _end has drained the queue would wait for
        # ever; _end sets _ended under the same lock, so the request is refused here.
        with self._lock:
            if self._ended is not None:
                raise self._failure(self._ended)
            if request.key in self._mine:
                raise ValueError(f"Requested to {request.signature[0]} a tensor with the "
                                 f"same name as another tensor that is currently being "
                                 f"processed: {request.name!r}. Names in flight must be "
                                 f"unique.")
            self._mine[request.key] = request
            request.handle.waiters = self._waiters
            timeline = self.timeline
            if timeline is not None:
                timeline.begin(_label(request.name, request.signature),
                               f"NEGOTIATE_{request.signature[0].upper()}")
            self._queue.put(request)
        return request.handle

    def join(self):
        """This rank has no more data: take part in the others' allreduces with zeros until
        every rank has joined; return the rank that joined last. Blocks."""
        handle = Handle()
        handle.waiters = self._waiters
        with self._lock:
            if self._ended is not None:
                raise self._failure(self._ended)
            self._queue.put(("join", handle))
        return handle.wait()

    def close(self, wait=True):
        """End the thread on every rank (after the cycle that carries this request);
        ``wait=False``: stop this rank's thread without telling the others (the job is
        ending)."""
        if not wait:
            self._stop.set()
            return
        if self._thread.is_alive():
            self._queue.put(("shutdown", None))
            self._thread.join()

    # ----- the communication thread ---------------------------------------------------------

    def _serve(self):
        reason = "Horovod has been shut down"
        try:
            while not self._stop.is_set():
                mine, bits = self._take()
                gathered = self._exchange(mine, bits)
                if gathered is None:
                    return              # stopped while waiting for the others
                if self.timeline is not None and (mine or bits or self._table):
                    self.timeline.mark_cycle()
                if self._merge(gathered):
                    reason = ("Horovod has been shut down. This was caused by an exception on "
                              "one of the ranks or an attempt to run a collective after one "
                              "of the ranks finished execution.")
                    break
                ran = self._run_ready()
                self._warn_stalls()
                # Whether anything was asked or ran is known alike on every rank.
                self._break_deadlock(ran or any(gathered))
        except BaseException as exc:  # noqa: B036 - every waiting caller must hear of it
            if not process_failure(exc):
                reason = f"the communication thread failed: {exc!r}"
                raise
            self._failure, reason = ProcessFailure, self._lost(exc)
        finally:
            self._end(reason)

    def _lost(self, exc):
        """After MPI reported a death: revoke the world's communicators, and say who died."""
        if self.revoke is not None:
            self.revoke()
        try:
            group = self.comm.Get_failed()
            failed = group.Translate_ranks(list(range(group.Get_size())),
                                           self.comm.Get_group())
        except Exception:  # noqa: BLE001 - the report above says enough without the ranks
            failed = []
        who = f"rank(s) {_ranks(sorted(failed))} of {self.size}" if failed else "a rank"
        return (f"{who} failed (MPI: {str(exc).strip()}); this rank's operations fail, and "
                f"hvd.elastic.run goes on from the last commit on the ranks that are left")

    def _take(self):
        """This rank's requests for the next negotiation.

        While operations wait in the table (or a rank has joined), negotiations keep
        Horovod's rhythm: one per cycle (``HPCTRAIN_CYCLE_TIME_MS``, 1 ms as Horovod's
        ``HOROVOD_CYCLE_TIME``), gathering whatever is queued meanwhile into one exchange.
        When nothing is in flight, this rank's first request starts a negotiation at once,
        so a lone synchronous call does not wait for a cycle; an idle thread still takes
        part in one negotiation per cycle, since another rank may have asked for something.
        """
        items = []
        try:
            if self._table or self._joined:
                while True:
                    remaining = self._started + CYCLE_S - time.monotonic()
                    if remaining <= 0:
                        break
                    items.append(self._queue.get(timeout=remaining))
            else:
                items.append(self._queue.get(timeout=CYCLE_S))
            while True:
                items.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        self._started = time.monotonic()
        mine, bits = [], []
        for item in items:
            if isinstance(item, Request):
                cached = self._cache.get(item.key) if item.repeats else None
                if cached is not None and cached.signature == item.signature:
                    bits.append(cached.number)
                    continue
                mine.append(("op", item.set_id, item.name, item.signature, item.info,
                             item.describe, item.repeats))
            else:
                kind, handle = item
                if kind == "join":
                    self._join_handle = handle
                mine.append((kind,))
        return mine, bits

    def _exchange(self, mine, bits):
        """Every rank's requests of this cycle, in rank order (``None`` if stopped): each
        rank's cached operations, announced by number (``("cached", number)``), then the
        requests it sent whole."""
        from mpi4py import MPI

        payload = pickle.dumps(mine, protocol=pickle.HIGHEST_PROTOCOL) if mine else b""
        # Per rank: the bytes of its requests, whether a thread of it waits for one, its
        # clock (rank 0's is the one every rank uses to time a deadlock alike), then a bit
        # per cached operation it asks for now. Every rank has the same cache, so the same
        # number of words.
        # An idle cycle (every millisecond) packs and unpacks no bits: 3 us instead of 13.
        words = -(-len(self._numbered) // 64)
        send = np.zeros(3 + words, dtype="<u8")
        send[:3] = (len(payload), self._waiters.count > 0, time.monotonic_ns() // 1000)
        if bits:
            flags = np.zeros(64 * words, dtype=bool)
            flags[bits] = True
            send[3:] = np.packbits(flags, bitorder="little").view("<u8")
        both = np.zeros((self.size, 3 + words), dtype="<u8")
        request = self.comm.Iallgather(send, both)
        # A few tests first (the others are often there already), then short sleeps, so
        # that a thread waiting for a slow rank leaves the core to the computation.
        spins = SPINS
        while not request.Test():
            if spins:
                spins -= 1
                continue
            if self._stop.is_set():
                return None
            time.sleep(POLL_S)
        counts, blocked = both[:, 0].astype(np.int64), both[:, 1]
        self._blocked = blocked.astype(bool).tolist()
        self._clock = int(both[0, 2]) / 1e6
        gathered = [[] for _ in range(self.size)]
        if both[:, 3:].any():
            asked = np.unpackbits(both[:, 3:].view(np.uint8), axis=1, bitorder="little")
            gathered = [[("cached", int(n)) for n in np.flatnonzero(row)] for row in asked]
        if not counts.any():
            return gathered
        data = np.empty(int(counts.sum()), dtype=np.uint8)
        self.comm.Allgatherv(np.frombuffer(payload, dtype=np.uint8),
                             [data, counts.tolist(), MPI.BYTE])
        offset = 0
        for rank, count in enumerate(counts.tolist()):
            if count:
                gathered[rank].extend(pickle.loads(data[offset:offset + count].tobytes()))
            offset += count
        return gathered

    def _merge(self, gathered):
        """Add every rank's requests to the table; True when a rank asked to shut down."""
        shutdown = False
        for rank, requests in enumerate(gathered):
            for request in requests:
                kind = request[0]
                if kind == "cached":
                    key = self._numbered[request[1]]
                    cached = self._cache[key]
                    self._add(key, rank, cached.signature, None, cached.describes.get(rank),
                              True)
                elif kind == "op":
                    _, set_id, name, signature, info, describe, repeats = request
                    self._add((set_id, name), rank, signature, info, describe, repeats)
                elif kind == "join":
                    self._joined[rank] = len(self._joined)
                elif kind == "shutdown":
                    shutdown = True
        return shutdown

    def _add(self, key, rank, signature, info, describe, repeats):
        entry = self._table.get(key)
        if entry is None:
            entry = self._table[key] = _Entry()
        entry.signatures[rank] = signature
        entry.infos[rank] = info
        entry.describes[rank] = describe
        entry.repeats = entry.repeats and repeats

    def _remember(self, key, entry, signature, joined):
        """Number an operation that is about to run and will repeat (the same decision on
        every rank: it rests only on what every rank gathered)."""
        if not entry.repeats or joined or key in self._cache or \
                len(self._numbered) >= CACHE_SIZE:
            return
        self._cache[key] = _Cached(len(self._numbered), signature, dict(entry.describes))
        self._numbered.append(key)

    def _members(self, set_id):
        """The world ranks of process set ``set_id``, in the set's rank order."""
        return self.sets[set_id].ranks

    def _run_ready(self):
        """Run every operation that all its ranks asked for, in table order; True if any
        ran (or failed)."""
        ran = False
        for key in list(self._table):
            entry = self._table[key]
            members = self._members(key[0]) if key[0] in self.sets else None
            if members is None:
                self._fail_entry(key, entry, f"process set {key[0]} has been removed")
                continue
            joined = [r for r in members if r in self._joined and r not in entry.signatures]
            if any(r not in entry.signatures and r not in joined for r in members):
                continue
            del self._table[key]
            self._stalled.discard(key)
            self._run_entry(key, entry, members, joined)
            ran = True
        if self._joined and len(self._joined) == self.size:
            last = max(self._joined, key=self._joined.get)
            self._joined.clear()
            handle, self._join_handle = self._join_handle, None
            if handle is not None:
                handle.finish(last)
            ran = True
        return ran

    def _break_deadlock(self, moved):
        """Fail everything in flight, on every rank, once every rank has been blocked
        waiting for operations that no other rank asked for, for ``DEADLOCK_S`` seconds
        with nothing asked or run meanwhile (ranks that issued different names, say). Every
        rank sees the same table, the same flags and the same clock (rank 0's, sent in
        every negotiation), so all decide alike, in the same negotiation, however slowly
        negotiations go on a loaded machine."""
        if moved or not self._table or not all(self._blocked):
            self._quiet_since = None
            return
        if self._quiet_since is None:
            self._quiet_since = self._clock
        if self._clock - self._quiet_since < DEADLOCK_S:
            return
        self._quiet_since = None
        waits = []
        for (set_id, name), entry in self._table.items():
            members = self._members(set_id) if set_id in self.sets else []
            missing = [r for r in members if r not in entry.signatures]
            waits.append(f"{name!r} asked for by rank(s) {_ranks(entry.signatures)}, never by "
                         f"rank(s) {_ranks(missing)}")
        why = ("deadlock: every rank is waiting for an operation that another rank will "
               "never ask for (ranks must ask for the same names): " + "; ".join(waits))
        for key, entry in list(self._table.items()):
            self._fail_entry(key, entry, why)

    def _run_entry(self, key, entry, members, joined):
        signatures = set(entry.signatures.values())
        signature = next(iter(signatures))
        if INVALID in signatures or len(signatures) > 1:
            self._fail_entry(key, entry, (
                "ranks made the same collective with different arguments (every rank must "
                "pass the same shape, dtype, op and root for one name): " +
                "; ".join(f"rank {r}: {d}" for r, d in sorted(entry.describes.items()))))
            return
        if joined and signature[0] not in self.joined_runs:
            self._fail_entry(key, entry, (
                f"{signature[0]} cannot run while rank(s) {_ranks(joined)} have joined "
                f"(hvd.join): only allreduce takes joined ranks' zeros"))
            return
        self._remember(key, entry, signature, joined)
        request = self._mine.pop(key, None)
        if request is None and self.rank not in joined:
            return                      # not a member of this set
        comm = self.sets[key[0]].comm
        timeline = self.timeline
        try:
            label = _label(key[1], signature)
            if timeline is not None:
                if request is not None:
                    timeline.end(label, f"NEGOTIATE_{signature[0].upper()}")
                timeline.begin(label, signature[0].upper())
            if request is None:
                self.joined_runs[signature[0]](comm, signature)
            else:
                request.handle.finish(request.run(comm, [entry.infos.get(r)
                                                         for r in members]))
        except BaseException as exc:  # noqa: B036 - handed to the caller that waits
            if request is None:
                raise
            if process_failure(exc):
                self._mine[key] = request   # failed by _end, with the reason every rank has
                raise
            request.handle.finish(error=exc)
        finally:
            if timeline is not None:
                timeline.end(label, signature[0].upper())

    def _fail_entry(self, key, entry, why):
        self._table.pop(key, None)
        self._stalled.discard(key)
        request = self._mine.pop(key, None)
        if request is not None:
            request.handle.finish(error=HorovodInternalError(why))

    def _warn_stalls(self):
        if not STALL_S or self.rank != 0 or not self._table:
            return
        now = time.monotonic()
        for key, entry in self._table.items():
            if key in self._stalled or now - entry.since < STALL_S:
                continue
            self._stalled.add(key)
            members = self._members(key[0]) if key[0] in self.sets else []
            missing = [r for r in members if r not in entry.signatures and r not in self._joined]
            print(f"[hpctrain] warning: {key[1]!r} has waited {now - entry.since:.0f} s for "
                  f"rank(s) {_ranks(missing)}, which have not asked for it: a rank that "
                  f"skips a collective, or issues it under another name, stalls the others",
                  flush=True)

    def _end(self, reason):
        """Fail every operation of this rank that will now never run."""
        error = self._failure
        with self._lock:
            self._ended = reason
        for request in list(self._mine.values()):
            request.handle.finish(error=error(reason))
        self._mine.clear()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            handle = item.handle if isinstance(item, Request) else item[1]
            if handle is not None:
                handle.finish(error=error(reason))
        if self._join_handle is not None:
            self._join_handle.finish(error=error(reason))
