"""The communication thread: operations are paired across ranks by name, then run in one order.

Horovod lets ranks issue their collectives in any order: an operation runs once every rank
of its process set has asked for the same name. The engine does the same with one thread
per rank and one *negotiation* per cycle over the world's private communicator:

1. the thread takes every request queued on this rank since the last negotiation, which
   starts as soon as it has one (:meth:`Engine._take` says when else);
2. ``Iallgather`` of what each rank has to say: how many bytes of requests, and the pickled
   requests themselves where they fit in :data:`INLINE` bytes (polled with short sleeps,
   so that a thread waiting for a slow rank does not spin a core), then, only if some
   rank's did not fit, ``Allgatherv`` of those;
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
``Iallgather`` of step 2 instead of being sent whole. A cycle in which every request is
cached is then one small collective, with nothing pickled, whatever the requests' size
(docs/training.md measures what that saves, and where it does not). The cache is filled
and read only on the communication thread, from what every rank gathered alike, so every
rank numbers alike.

An operation can also fail before every member has asked for it: by its own ``timeout`` (a
``torch.distributed`` group's) or by the deadlock verdict (:class:`StallInspector`), decided
alike on every rank. An unnamed one (``noname.N``, never asked for twice) is then
remembered (:class:`Failed`): a member that asks for it late fails at once with the same
reason, so that it fails on every rank and the set's next operations still pair up.

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

The parts, and which thread may touch what:

- :class:`Pending` — this rank's operations between ``submit`` and their run: the callers'
  threads add to it (under its lock, which also orders them against the end), the
  communication thread takes, pops and ends it;
- :class:`Signature` — what every rank of an operation must pass alike, built on the
  callers' threads (by :func:`hpctrain.torch.ops.common.signature`) and immutable, so that
  the communication thread may compare, hash and pickle it;
- the wire messages (:class:`OpAsked`, :class:`CachedAsked`, :class:`JoinAsked`,
  :class:`ShutdownAsked`) — what a rank tells the others in a negotiation; built and read on
  the communication thread only;
- the negotiation (:meth:`Engine._exchange`, :meth:`Engine._merge`) and the table of
  operations — communication thread only;
- :class:`ResponseCache` — the numbered operations (each a :class:`Response`), the same on
  every rank; communication thread only;
- :class:`StallInspector` — the warning on rank 0 about operations some ranks never ask for,
  and the verdicts every rank reaches alike (a deadlock, a timeout); communication thread
  only;
- :class:`Failed` — unnamed operations that failed before some members asked for them;
  communication thread only;
- :class:`Joins` — the ranks that have joined, and this rank's waiting ``join``;
  communication thread only;
- the timeline — written on the communication thread only; swapped there too (a caller's
  ``set_timeline`` is queued like a request and waited for), except once the engine has
  ended, when the caller swaps it while the thread's last act may be swapping it to
  ``None``: each swap holds ``_timeline_lock``, so every timeline replaced is closed once.
"""

import pickle
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .settings import Settings
from ..mpi.ulfm import process_failure
from ..log import logger
from ..stalls import StallRule, stalled

LOG = logger()

#: Seconds between polls of a negotiation that other ranks have not joined yet.
POLL_S = 0.0001
#: Tests of a negotiation before the thread starts sleeping between them.
SPINS = 200
#: Bytes of pickled requests per rank that travel in a negotiation's first gather (an
#: allreduce's is about 300); larger ones follow in an ``Allgatherv``.
INLINE = 1024
#: Negotiations that a stopped thread left pending (``abandon``: the job is ending, or every
#: rank failed together and may ``init`` again), with their buffers. MPI can still complete
#: such a gather when a peer's thread joins it later, and it then writes into the receive
#: buffer: freed with its request, that memory would be another object's by then.
UNFINISHED = []
#: The queue of requests from the callers' threads to the communication thread. Not
#: ``queue.SimpleQueue``: in CPython 3.11 its ``get(timeout=t)`` can wait for ever when the
#: thread is preempted for longer than ``t`` at the wrong moment (its recomputed timeout goes
#: negative, which means "no timeout"), and the engine waits with timeouts of a cycle or
#: less on a machine where ranks outnumber cores. ``queue.Queue`` checks for that.
Inbox = queue.Queue


class HorovodInternalError(RuntimeError):
    """An operation failed on every rank that asked for it (mismatch, shutdown, join)."""


class ProcessFailure(HorovodInternalError):
    """A rank of the world died (reported by an MPI with fault tolerance): raised by every
    survivor's pending and later operations until ``hvd.elastic.run`` shrinks the world."""


def lost(comm, exc):
    """Why operations fail after MPI reported a death (``exc``, a
    :func:`~hpctrain.mpi.ulfm.process_failure`): the ranks of ``comm`` that it knows have
    failed, and what can go on."""
    try:
        group = comm.Get_failed()
        failed = group.Translate_ranks(list(range(group.Get_size())), comm.Get_group())
    except Exception:  # noqa: BLE001 - the report says enough without the ranks
        failed = []
    who = f"rank(s) {_ranks(sorted(failed))} of {comm.Get_size()}" if failed else "a rank"
    return (f"{who} failed (MPI: {str(exc).strip()}): this rank's operations fail from now "
            f"on. hvd.elastic.run goes on from its last commit on the ranks that are left; a "
            f"torch.distributed process group cannot shrink: end the job and start it again "
            f"from a checkpoint")


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


@dataclass(frozen=True, slots=True)
class Signature:
    """What every rank must pass identically for one operation: compared across ranks,
    after travelling pickled in a negotiation, so it is immutable, hashable and compared by
    value. Built by :func:`hpctrain.torch.ops.common.signature` (:data:`INVALID` aside).

    ``kind``: the operation (``"allreduce"``, ``"barrier"``, ...), which names its timeline
    phases and picks a joined rank's part (``Engine.joined_runs``); ``shapes``, ``dtypes``,
    ``devices``: one per tensor (``"float32"``, ``"cpu"``; an allgather's and an alltoall's
    shapes without their first dimension, which may differ by rank); ``op``, ``prescale``,
    ``postscale``: a reduction's; ``extra``: whatever else the ranks must agree on (a root,
    a bucket's parameter names, a group's ranks).
    """

    kind: str
    shapes: tuple = ()
    dtypes: tuple = ()
    devices: tuple = ()
    op: object = None
    prescale: float = 1.0
    postscale: float = 1.0
    extra: tuple = ()


#: The signature of a request whose arguments were bad on its rank: its operation fails on
#: every rank that asked, whatever the others passed.
INVALID = Signature("invalid")


class OpKey(NamedTuple):
    """What pairs an operation across ranks: its process set and its name (the key of the
    table, the cache and this rank's pending requests)."""

    set_id: int
    name: str


class Request:
    """This rank's side of one operation.

    ``signature``: a :class:`Signature`, what every rank must pass identically (compared
    across ranks);
    ``info``: what may differ and the others need (an allgather's first dimension, an
    alltoall's splits); ``describe``: the call in words, for error messages; ``run(comm,
    infos)``: the data phase on the communication thread, over the process set's
    communicator, given every member's ``info`` in the set's rank order (ranks that joined
    take part through the engine's ``joined_runs``). A request whose signature is
    ``INVALID`` had bad arguments here: the others fail with this rank's reason instead of
    waiting for it. ``repeats``: the same name and signature will be asked for again and
    again (gradient buckets): worth a number in the cache (see the module docstring).
    ``timeout``: seconds after which the operation fails on every rank of its set if some
    member has still not asked for it (a ``torch.distributed`` group's ``timeout``; ``None``:
    no limit). Such a request is always sent whole: the limit travels with it.
    """

    __slots__ = ("set_id", "name", "signature", "info", "describe", "run", "handle", "repeats",
                 "timeout")

    def __init__(self, set_id, name, signature, describe, run, info=None, repeats=False,
                 timeout=None):
        self.set_id, self.name, self.signature = set_id, name, signature
        self.info, self.describe, self.run = info, describe, run
        self.timeout = timeout
        self.repeats = repeats and info is None and signature is not INVALID and \
            timeout is None
        self.handle = Handle()

    @property
    def key(self):
        """What pairs this request with the other ranks': its process set and name."""
        return OpKey(self.set_id, self.name)


def _ranks(ranks):
    return ", ".join(map(str, sorted(ranks)))


def _label(name, signature):
    """How the timeline shows an operation: named by its kind, as Horovod's."""
    return f"{signature.kind}.{name}" if unique(name) else name


def unique(name):
    """True for the name of an unnamed operation (``noname.N``): numbered by its set, never
    asked for twice, so once it has failed, a rank that asks for it later can only fail."""
    return name.startswith("noname.")


class _Entry:
    """One operation in the table: which ranks asked, with what."""

    __slots__ = ("signatures", "infos", "describes", "since", "first", "repeats", "timeout")

    def __init__(self, first):
        self.signatures, self.infos, self.describes = {}, {}, {}
        self.since = time.monotonic()
        self.first = first      # rank 0's clock at the negotiation that first saw it
        self.repeats = True     # every rank that asked said it repeats, or came from the cache
        self.timeout = None     # the shortest limit of the ranks that asked (None: none)


# ----- what a rank tells the others in a negotiation (communication thread only) ------------

@dataclass(frozen=True)
class OpAsked:
    """A rank asks for an operation, sent whole (pickled in the ``Allgatherv``)."""

    set_id: int
    name: str
    signature: Signature
    info: object
    describe: str
    repeats: bool
    timeout: object = None

    @property
    def key(self):
        return OpKey(self.set_id, self.name)


@dataclass(frozen=True)
class CachedAsked:
    """A rank asks again for a numbered operation of the cache (one bit of the
    ``Iallgather``; never pickled)."""

    number: int


@dataclass(frozen=True)
class JoinAsked:
    """A rank has joined (:func:`hpctrain.torch.join`)."""


@dataclass(frozen=True)
class ShutdownAsked:
    """A rank shuts down: every rank's thread ends after this cycle."""


@dataclass
class Control:
    """A caller's request that is not an operation, queued beside them: ``kind`` is
    ``"join"``, ``"shutdown"`` or ``"timeline"`` (``value``: the new timeline, or
    ``None``); ``handle`` is finished when the communication thread has done it."""

    kind: str
    handle: object = None
    value: object = None


# ----- the parts ---------------------------------------------------------------------------

class Pending:
    """This rank's operations between ``submit`` and their run.

    Threads: the callers' threads call :meth:`add` and :meth:`control`; the communication
    thread calls :meth:`take`, :meth:`pop` and :meth:`end`. ``_lock`` makes "not ended yet?
    then queue" one step against :meth:`end`, which sets the reason and then drains: a
    request is either refused, or queued before the drain and failed by it; never queued
    after it, to wait for ever.
    """

    def __init__(self, waiters):
        self._queue = Inbox()
        self._mine = {}                 # key -> Request, submitted, not yet run or failed
        self._lock = threading.Lock()
        self._waiters = waiters
        self.ended = None               # why operations fail now (None while running)
        self.failure = HorovodInternalError

    def add(self, request):
        """Queue ``request`` (a caller's thread); ``ValueError`` if a request of its name
        is in flight, the end's error if the engine has ended."""
        with self._lock:
            if self.ended is not None:
                raise self.failure(self.ended)
            key = request.key
            if key in self._mine:
                raise ValueError(f"Requested to {request.signature.kind} a tensor with the "
                                 f"same name as another tensor that is currently being "
                                 f"processed: {request.name!r}. Names in flight must be "
                                 f"unique.")
            self._mine[key] = request
            request.handle.waiters = self._waiters
            self._queue.put(request)
        return request.handle

    def control(self, item):
        """Queue a :class:`Control` (a caller's thread); the end's error if ended."""
        with self._lock:
            if self.ended is not None:
                raise self.failure(self.ended)
            self._queue.put(item)

    def take(self, timeout):
        """The next queued item within ``timeout`` seconds (``None``: wait at most no time;
        raises ``queue.Empty``)."""
        if timeout is None:
            return self._queue.get_nowait()
        return self._queue.get(timeout=timeout)

    def pop(self, key):
        """This rank's request of ``key``, taken out (``None`` if it has none)."""
        return self._mine.pop(key, None)

    def restore(self, key, request):
        """Put back a request whose run a death interrupted: :meth:`end` fails it."""
        self._mine[key] = request

    def end(self, reason, failure):
        """Fail every operation of this rank that will now never run, and every later one."""
        with self._lock:
            self.ended, self.failure = reason, failure
        for request in list(self._mine.values()):
            request.handle.finish(error=failure(reason))
        self._mine.clear()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item.handle is not None:
                item.handle.finish(error=failure(reason))
            if isinstance(item, Control) and item.kind == "timeline" and item.value is not None:
                item.value.close()


@dataclass(frozen=True, slots=True)
class Response:
    """A numbered operation of the :class:`ResponseCache`, the same on every rank: what a
    rank that announces ``number`` asks for (``describes``: each rank's call in words, for
    a mismatch's message)."""

    number: int
    key: OpKey
    signature: Signature
    describes: dict


class ResponseCache:
    """Operations asked for again and again, numbered alike on every rank (see the module
    docstring). Communication thread only: filled and read from what every rank gathered."""

    def __init__(self, capacity):
        self.capacity = capacity        # operations it numbers at most (0: none)
        self._responses = {}            # key -> Response
        self.numbered = []              # the keys by number

    def __contains__(self, key):
        return key in self._responses

    def number_of(self, request):
        """The number that announces ``request`` (``None``: send it whole)."""
        response = self._responses.get(request.key) if request.repeats else None
        if response is not None and response.signature == request.signature:
            return response.number
        return None

    def asked(self, number):
        """The :class:`Response` that a rank announces by ``number``."""
        return self._responses[self.numbered[number]]

    def words(self):
        """How many 64-bit words announce the numbered operations."""
        return -(-len(self.numbered) // 64)

    def remember(self, key, entry, signature, joined):
        """Number an operation that is about to run and will repeat (the same decision on
        every rank: it rests only on what every rank gathered)."""
        if not entry.repeats or joined or key in self._responses or \
                len(self.numbered) >= self.capacity:
            return
        self._responses[key] = Response(len(self.numbered), key, signature,
                                        dict(entry.describes))
        self.numbered.append(key)


class Joins:
    """The ranks that have joined, in order, and this rank's waiting ``join``.
    Communication thread only."""

    def __init__(self):
        self.order = {}                 # rank -> order of joining (the same on every rank)
        self.handle = None              # this rank's join, waiting

    def __bool__(self):
        return bool(self.order)

    def __contains__(self, rank):
        return rank in self.order

    def add(self, rank):
        self.order[rank] = len(self.order)

    def complete(self, size):
        """When every rank has joined: finish this rank's join with the rank that joined
        last, start afresh, and say so."""
        if len(self.order) != size:
            return False
        last = max(self.order, key=self.order.get)
        self.order.clear()
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.finish(last)
        return True

    def fail(self, error):
        if self.handle is not None:
            self.handle.finish(error=error)
            self.handle = None


class Failed:
    """Unnamed operations that failed before every member of their set asked for them (a
    timeout, the deadlock verdict), with the members that had not asked: when one of them
    asks at last, it fails with the same reason, so that the operation fails on every rank
    of the set and its ranks' later operations still pair up. The same on every rank (filled
    and read from what every rank gathered). Communication thread only."""

    #: Failures remembered at most (the oldest forgotten first): a member that never asks
    #: (it went on to something else) must not make the table grow for ever.
    CAPACITY = 4096

    def __init__(self):
        self._waiting = OrderedDict()   # key -> (reason, members that have not asked)

    def remember(self, key, missing, why):
        """``key`` failed with ``why`` while ``missing`` had not asked for it."""
        if missing:
            self._waiting[key] = (why, set(missing))
            while len(self._waiting) > self.CAPACITY:
                self._waiting.popitem(last=False)

    def late(self, key, rank):
        """Why ``key`` failed, if ``rank`` asks for it only now (counted as asked), else
        ``None``."""
        why, missing = self._waiting.get(key, (None, ()))
        if rank not in missing:
            return None
        missing.discard(rank)
        if not missing:
            del self._waiting[key]
        return why


class StallInspector:
    """Operations some ranks never ask for, timed by the :class:`~.settings.Settings` under
    the one rule of :mod:`hpctrain.stalls`:

    - rank 0 warns once an operation has waited ``stall_check_s`` (as Horovod's stall
      inspector);
    - every rank shuts the engine down once an operation has waited ``stall_shutdown_s``
      (Horovod's ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``; 0: never);
    - every rank fails everything in flight once every rank has been blocked with nothing
      moving for ``deadlock_s``;
    - every rank fails an operation that has waited its own ``timeout`` (a
      ``torch.distributed`` group's).

    The last three are decided alike on every rank, from the same table, flags and clock
    (rank 0's, sent in every negotiation). Communication thread only."""

    def __init__(self, rank, settings):
        self.rank = rank
        self.settings = settings
        self.rule = StallRule(settings.stall_check_s, settings.stall_shutdown_s)
        self.blocked = []               # per rank, from the last negotiation
        self.clock = 0.0                # rank 0's clock at the last negotiation (seconds)
        self._quiet_since = None        # rank 0's clock when every rank became blocked

    def note(self, blocked, clock):
        """What the last negotiation said: which ranks wait, and rank 0's clock."""
        self.blocked, self.clock = blocked, clock

    def settled(self, key):
        """``key`` ran or failed: forget it."""
        self.rule.settled(key)

    def warn(self, table, missing):
        """Rank 0: name, once, the ranks an operation has waited ``stall_check_s`` for
        (``missing(key, entry)``)."""
        if self.rank != 0:
            return
        now = time.monotonic()
        for key, entry in table.items():
            if self.rule.warn(key, now - entry.since):
                LOG.warning(stalled(repr(key.name), now - entry.since, missing(key, entry),
                                    "asked for it") +
                            ": a rank that skips a collective, or issues it under another "
                            "name, stalls the others")

    def shutdown(self, table, missing):
        """The reason to shut down on every rank, or ``None``: an operation has waited
        ``stall_shutdown_s`` (rank 0's clock, from the negotiation that first saw it) for
        ranks that have not asked for it."""
        for key, entry in table.items():
            if self.rule.give_up(self.clock - entry.first):
                limit = self.settings.stall_shutdown_s
                return (stalled(repr(key.name), self.clock - entry.first, missing(key, entry),
                                "asked for it") +
                        f" (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={limit:g})")
        return None

    def expired(self, table, missing):
        """``(key, reason)`` of every operation that has waited its own ``timeout`` (a
        ``torch.distributed`` group's; rank 0's clock, from the negotiation that first saw
        it) for members that have not asked for it: it fails on every rank that asked, and
        on the others when they ask (:class:`Failed`)."""
        out = []
        for key, entry in table.items():
            if entry.timeout is None or self.clock - entry.first < entry.timeout:
                continue
            call = next(iter(entry.describes.values()))
            # Worded so that gloo's own tests recognise it (" Timed out ", " timeout ").
            out.append((key, f"{call}: Timed out waiting {entry.timeout * 1000:.0f}ms for "
                             f"rank(s) {_ranks(missing(key, entry))}, which have not called "
                             f"it (rank(s) {_ranks(entry.signatures)} have): it did not "
                             f"complete within its timeout of {entry.timeout:g} s (its "
                             f"process group's timeout=, or the call's), and fails on every "
                             f"rank of the group, on those ranks too when they call it"))
        return out

    def deadlock(self, table, moved, missing):
        """The reason to fail everything in flight, or ``None``: every rank blocked for
        ``deadlock_s`` on operations that no other rank asked for, with nothing asked or
        run meanwhile (ranks that issued different names, say)."""
        if moved or not table or not all(self.blocked):
            self._quiet_since = None
            return None
        if self._quiet_since is None:
            self._quiet_since = self.clock
        if self.clock - self._quiet_since < self.settings.deadlock_s:
            return None
        self._quiet_since = None
        waits = [f"{key.name!r} asked for by rank(s) {_ranks(entry.signatures)}, never by "
                 f"rank(s) {_ranks(missing(key, entry))}" for key, entry in table.items()]
        return ("deadlock: every rank is waiting for an operation that another rank will "
                "never ask for (ranks must ask for the same names): " + "; ".join(waits))


class Engine:
    """The negotiating communication thread of one world (see the module docstring).

    ``comm``: the world's private communicator, used only by this thread; ``sets``: the
    live process sets by id (this rank's communicator of each, ``None`` where it is not a
    member) — read by the thread, so it is changed only by operations that run there.
    Callers' threads use :meth:`submit`, :meth:`join`, :meth:`set_timeline` and
    :meth:`close`; every attribute is the communication thread's.
    """

    def __init__(self, comm, sets, joined_runs, revoke=None, settings=None):
        self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()
        self.settings = Settings() if settings is None else settings
        self.sets = sets
        self.joined_runs = joined_runs      # kind -> run(comm, signature): a joined rank's part
        self.revoke = revoke                # revoke() every communicator, after a death
        self.timeline = None                # swapped by set_timeline, on this thread
        self._timeline_lock = threading.Lock()   # a swap after the end races the thread's last
        self._waiters = Waiters()
        self.pending = Pending(self._waiters)
        self.cache = ResponseCache(self.settings.cache_capacity)
        self.joins = Joins()
        self.stalls = StallInspector(self.rank, self.settings)
        self._failed = Failed()
        self._table = OrderedDict()     # key -> _Entry, the same on every rank
        self._started = 0.0             # when the last negotiation began (monotonic)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hpctrain-comm", daemon=True)
        self._thread.start()

    # ----- the callers' side ----------------------------------------------------------------

    def submit(self, request):
        """Queue ``request``; return its :class:`Handle`. ``ValueError`` (here, before
        anything is queued) if this rank already has an operation of that name in flight."""
        return self.pending.add(request)

    def join(self):
        """This rank has no more data: take part in the others' allreduces with zeros until
        every rank has joined; return the rank that joined last. Blocks."""
        handle = Handle()
        handle.waiters = self._waiters
        self.pending.control(Control("join", handle))
        return handle.wait()

    def set_timeline(self, timeline):
        """Record operations into ``timeline`` from now on (``None``: stop), closing the one
        it replaces: done on the communication thread, which alone writes timelines; this
        returns once it is done. After the end, there is no thread: done here."""
        handle = Handle()
        try:
            self.pending.control(Control("timeline", handle, timeline))
        except HorovodInternalError:
            self._swap_timeline(timeline)
            return
        handle.wait()

    def close(self, wait=True):
        """End the thread on every rank (after the cycle that carries this request);
        ``wait=False``: stop this rank's thread without telling the others (the job is
        ending)."""
        if not wait:
            self._stop.set()
            return
        if self._thread.is_alive():
            try:
                self.pending.control(Control("shutdown"))
            except HorovodInternalError:
                pass                    # ended meanwhile: the thread is ending too
            self._thread.join()

    # ----- the communication thread ---------------------------------------------------------

    def _swap_timeline(self, timeline):
        with self._timeline_lock:
            old, self.timeline = self.timeline, timeline
        if old is not None and old is not timeline:
            old.close()

    def _serve(self):
        reason = "Horovod has been shut down"
        try:
            while not self._stop.is_set():
                mine, bits = self._take()
                gathered = self._exchange(mine, bits)
                if gathered is None:
                    return              # stopped while waiting for the others
                if self.timeline is not None:
                    if mine or bits or self._table:
                        self.timeline.mark_cycle()
                    else:
                        self.timeline.flush()   # idle: what was recorded is in the file
                if self._merge(gathered):
                    reason = ("Horovod has been shut down. This was caused by an exception on "
                              "one of the ranks or an attempt to run a collective after one "
                              "of the ranks finished execution.")
                    break
                ran = self._run_ready()
                for key, why in self.stalls.expired(self._table, self._missing):
                    self._fail_entry(key, self._table[key], why)
                self.stalls.warn(self._table, self._missing)
                stalled = self.stalls.shutdown(self._table, self._missing)
                if stalled is not None:
                    reason = f"Horovod has been shut down: {stalled}"
                    break
                # Whether anything was asked or ran is known alike on every rank.
                why = self.stalls.deadlock(self._table, ran or any(gathered), self._missing)
                if why is not None:
                    for key, entry in list(self._table.items()):
                        self._fail_entry(key, entry, why)
        except BaseException as exc:  # noqa: B036 - every waiting caller must hear of it
            if not process_failure(exc):
                reason = f"the communication thread failed: {exc!r}"
                raise
            self.pending.failure, reason = ProcessFailure, self._lost(exc)
        finally:
            self._end(reason)
            self._swap_timeline(None)   # the file is complete once the engine has ended

    def _lost(self, exc):
        """After MPI reported a death: revoke the world's communicators, and say who died."""
        if self.revoke is not None:
            self.revoke()
        return lost(self.comm, exc)

    def _take(self):
        """This rank's requests for the next negotiation: ``(messages, numbers)``.

        A negotiation starts as soon as this rank has something to say: a request (or a
        join, a shutdown) queued since the last one starts the next at once, whatever waits
        in the table, and everything queued meanwhile goes with it. With nothing to say:

        - while the table holds only operations that wait for *other* ranks, at once too:
          only a negotiation can move them, and this rank is then already in it when the
          last of those ranks asks (instead of up to a cycle later);
        - otherwise (nothing in flight, or this rank owes an operation, or a rank has
          joined) once a cycle has passed (``Settings.cycle_s``: ``HPCTRAIN_CYCLE_TIME_MS``
          or ``HOROVOD_CYCLE_TIME``, 1 ms by default, as Horovod's), since another rank may
          have asked for something, and timeouts and verdicts are decided in negotiations.

        Never do all ranks start at once with nothing to say: every operation left in the
        table after a negotiation waits for some member that has neither asked nor joined
        (the others ran or failed), and that rank keeps the cycle.
        """
        items = []
        try:
            if not self._table or self._owes():
                cycle = self.settings.cycle_s
                if self._table or self.joins:
                    cycle += self._started - time.monotonic()
                items.append(self.pending.take(cycle if cycle > 0 else None))
            while True:
                items.append(self.pending.take(None))
        except queue.Empty:
            pass
        self._started = time.monotonic()
        mine, bits = [], []
        for item in items:
            if isinstance(item, Control):
                if item.kind == "timeline":
                    self._swap_timeline(item.value)
                    item.handle.finish()
                elif item.kind == "join":
                    self.joins.handle = item.handle
                    mine.append(JoinAsked())
                else:
                    mine.append(ShutdownAsked())
                continue
            if self.timeline is not None:
                self.timeline.begin(_label(item.name, item.signature),
                                    f"NEGOTIATE_{item.signature.kind.upper()}")
            number = self.cache.number_of(item)
            if number is not None:
                bits.append(number)
            else:
                mine.append(OpAsked(item.set_id, item.name, item.signature, item.info,
                                    item.describe, item.repeats, item.timeout))
        return mine, bits

    def _owes(self):
        """True when an operation in the table waits for this rank (a member that has
        neither asked for it nor joined)."""
        return any(self.rank in self._missing(key, entry) for key, entry in self._table.items())

    def _exchange(self, mine, bits):
        """Every rank's messages of this cycle, in rank order (``None`` if stopped): each
        rank's numbered operations (:class:`CachedAsked`), then what it sent whole.

        Over one rank there is no one to tell: nothing is sent or pickled."""
        if self.size == 1:
            self.stalls.note([self._waiters.count > 0], time.monotonic())
            return [[CachedAsked(n) for n in sorted(bits)] + list(mine)]
        payload = pickle.dumps(mine, protocol=pickle.HIGHEST_PROTOCOL) if mine else b""
        # Per rank: the bytes of its requests, whether a thread of it waits for one, its
        # clock (rank 0's is the one every rank uses to time a deadlock alike), then a bit
        # per cached operation it asks for now (every rank has the same cache, so the same
        # number of words), then its pickled requests where they fit in INLINE bytes: a
        # cycle whose requests all fit is one meeting of the ranks, not two.
        # An idle cycle (every millisecond) packs and unpacks no bits: 3 us instead of 13.
        words = self.cache.words()
        send = np.zeros(3 + words + INLINE // 8, dtype="<u8")
        send[:3] = (len(payload), self._waiters.count > 0, time.monotonic_ns() // 1000)
        if bits:
            flags = np.zeros(64 * words, dtype=bool)
            flags[bits] = True
            send[3:3 + words] = np.packbits(flags, bitorder="little").view("<u8")
        if len(payload) <= INLINE:
            send[3 + words:].view(np.uint8)[:len(payload)] = np.frombuffer(payload, np.uint8)
        both = np.zeros((self.size, len(send)), dtype="<u8")
        if not self._wait(self.comm.Iallgather(send, both), bool(mine or bits), (send, both)):
            return None
        counts = both[:, 0].astype(np.int64).tolist()
        self.stalls.note(both[:, 1].astype(bool).tolist(), int(both[0, 2]) / 1e6)
        gathered = [[] for _ in range(self.size)]
        if both[:, 3:3 + words].any():
            asked = np.unpackbits(both[:, 3:3 + words].view(np.uint8), axis=1,
                                  bitorder="little")
            gathered = [[CachedAsked(int(n)) for n in np.flatnonzero(row)] for row in asked]
        spilled = self._spilled(payload, counts)
        for rank, count in enumerate(counts):
            if count > INLINE:
                gathered[rank].extend(pickle.loads(spilled[rank]))
            elif count:
                inline = both[rank, 3 + words:].view(np.uint8)
                gathered[rank].extend(pickle.loads(inline[:count].tobytes()))
        return gathered

    def _wait(self, request, news, buffers):
        """Poll ``request`` (a negotiation's gather) until done; False if stopped meanwhile.
        A request left pending keeps ``buffers`` for ever (:data:`UNFINISHED`).

        With news (``news``: this rank asks for something), a few tests first (the others
        are often there already), then short sleeps, so that a thread waiting for a slow rank
        leaves the core to the computation. With nothing to say (an idle cycle, or waiting
        for ranks that owe an operation), nobody waits for this negotiation to end: sleeps
        at once, so that idle threads do not spin on a machine with fewer cores than busy
        threads while a peer waits for one."""
        spins = SPINS if news else 0
        while not request.Test():
            if spins:
                spins -= 1
                continue
            if self._stop.is_set():
                UNFINISHED.append((request, buffers))
                return False
            time.sleep(POLL_S)
        return True

    def _spilled(self, payload, counts):
        """The ranks' pickled requests that did not fit in the gather (``counts``: each
        rank's bytes), by rank: one ``Allgatherv`` of those alone, where there are any."""
        from mpi4py import MPI

        large = [count if count > INLINE else 0 for count in counts]
        if not any(large):
            return {}
        data = np.empty(sum(large), dtype=np.uint8)
        mine = payload if len(payload) > INLINE else b""
        self.comm.Allgatherv(np.frombuffer(mine, dtype=np.uint8), [data, large, MPI.BYTE])
        offsets = np.cumsum([0] + large).tolist()
        return {rank: data[offsets[rank]:offsets[rank + 1]].tobytes()
                for rank, count in enumerate(large) if count}

    def _merge(self, gathered):
        """Add every rank's messages to the table; True when a rank asked to shut down."""
        shutdown = False
        for rank, messages in enumerate(gathered):
            for message in messages:
                if isinstance(message, CachedAsked):
                    response = self.cache.asked(message.number)
                    self._add(response.key, rank, response.signature, None,
                              response.describes.get(rank), True)
                elif isinstance(message, OpAsked):
                    self._add(message.key, rank, message.signature, message.info,
                              message.describe, message.repeats, message.timeout)
                elif isinstance(message, JoinAsked):
                    self.joins.add(rank)
                elif isinstance(message, ShutdownAsked):
                    shutdown = True
        return shutdown

    def _add(self, key, rank, signature, info, describe, repeats, timeout=None):
        why = self._failed.late(key, rank)
        if why is not None:
            self._fail_late(key, rank, why)
            return
        entry = self._table.get(key)
        if entry is None:
            entry = self._table[key] = _Entry(self.stalls.clock)
        entry.signatures[rank] = signature
        entry.infos[rank] = info
        entry.describes[rank] = describe
        entry.repeats = entry.repeats and repeats
        if timeout is not None:
            entry.timeout = timeout if entry.timeout is None else min(entry.timeout, timeout)

    def _fail_late(self, key, rank, why):
        """Rank ``rank`` asked for ``key`` after it failed on the ranks that had: it fails
        there too, with their reason, instead of waiting for ranks that have gone on."""
        request = self.pending.pop(key) if rank == self.rank else None
        if request is not None:
            request.handle.finish(error=HorovodInternalError(why))

    def _members(self, set_id):
        """The world ranks of process set ``set_id``, in the set's rank order."""
        return self.sets[set_id].ranks

    def _missing(self, key, entry):
        """The members of ``key``'s set that have neither asked for it nor joined."""
        members = self._members(key.set_id) if key.set_id in self.sets else []
        return [r for r in members if r not in entry.signatures and r not in self.joins]

    def _run_ready(self):
        """Run every operation that all its ranks asked for, in table order; True if any
        ran (or failed)."""
        ran = False
        for key in list(self._table):
            entry = self._table[key]
            members = self._members(key.set_id) if key.set_id in self.sets else None
            if members is None:
                self._fail_entry(key, entry, f"process set {key.set_id} has been removed")
                continue
            joined = [r for r in members if r in self.joins and r not in entry.signatures]
            if any(r not in entry.signatures and r not in joined for r in members):
                continue
            del self._table[key]
            self.stalls.settled(key)
            self._run_entry(key, entry, members, joined)
            ran = True
        return self.joins.complete(self.size) or ran

    def _run_entry(self, key, entry, members, joined):
        signatures = set(entry.signatures.values())
        signature = next(iter(signatures))
        if INVALID in signatures or len(signatures) > 1:
            self._fail_entry(key, entry, (
                "ranks made the same collective with different arguments (every rank must "
                "pass the same shape, dtype, op and root for one name): " +
                "; ".join(f"rank {r}: {d}" for r, d in sorted(entry.describes.items()))))
            return
        if joined and signature.kind not in self.joined_runs:
            self._fail_entry(key, entry, (
                f"{signature.kind} cannot run while rank(s) {_ranks(joined)} have joined "
                f"(hvd.join): only allreduce takes joined ranks' zeros"))
            return
        self.cache.remember(key, entry, signature, joined)
        request = self.pending.pop(key)
        if request is None and self.rank not in joined:
            return                      # not a member of this set
        comm = self.sets[key.set_id].comm
        timeline = self.timeline
        try:
            label = _label(key.name, signature)
            if timeline is not None:
                if request is not None:
                    timeline.end(label, f"NEGOTIATE_{signature.kind.upper()}")
                timeline.begin(label, signature.kind.upper())
            if request is None:
                self.joined_runs[signature.kind](comm, signature)
            else:
                request.handle.finish(request.run(comm, [entry.infos.get(r)
                                                         for r in members]))
        except BaseException as exc:  # noqa: B036 - handed to the caller that waits
            if request is None:
                raise
            if process_failure(exc):
                self.pending.restore(key, request)  # failed by _end, with every rank's reason
                raise
            request.handle.finish(error=exc)
        finally:
            if timeline is not None:
                timeline.end(label, signature.kind.upper())

    def _fail_entry(self, key, entry, why):
        self._table.pop(key, None)
        self.stalls.settled(key)
        if unique(key.name):
            self._failed.remember(key, self._missing(key, entry), why)
        request = self.pending.pop(key)
        if request is not None:
            request.handle.finish(error=HorovodInternalError(why))

    def _end(self, reason):
        """Fail every operation of this rank that will now never run."""
        failure = self.pending.failure
        self.pending.end(reason, failure)
        self.joins.fail(failure(reason))
