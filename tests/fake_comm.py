"""An in-memory stand-in for an MPI communicator: ranks are threads, messages follow MPI's
matching and completion rules, and a deadlock is reported instead of hanging.

Messages match in the order they were posted, per (communicator, source, destination,
tag), as MPI's non-overtaking rule says. A send of at most ``eager`` bytes is buffered: it
completes when posted, as Open MPI's eager protocol does. A larger one is synchronous: a
``Send``, or the ``Wait`` of an ``Isend``, returns only once the matching receive has been
posted (rendezvous; the MPI standard lets any ``MPI_Send`` block so). ``Sendrecv`` posts
both halves before it waits, so two ranks that swap with it never block each other. With
``eager=0`` there is no eager protocol: every send is synchronous, empty ones too, the
strictest behaviour MPI allows. Since every
receive here names its source and tag, matching does not depend on timing, and a schedule
that completes with ``eager=0`` completes with any eager limit.

Every wait of every rank, in a message or in a collective of a split communicator, goes
through one condition variable, so the run always knows which ranks wait on what. When
every rank still running waits and no wait can end, that is a deadlock: each waiting rank
raises :class:`Deadlock` with the list of what every rank was waiting for.
"""

import threading
import time
from collections import deque

import numpy as np
from mpi4py import MPI

#: An eager limit no message reaches: every send is buffered.
BUFFERED = 1 << 62
#: Seconds a run may take in all, a backstop for what the deadlock check cannot see.
TIMEOUT = 120.0


class Deadlock(AssertionError):
    """Every live rank waits and none of the waits can end; the message says on what."""


class World:
    """What every communicator of one run shares: the eager limit, the lock, and what each
    rank is doing (running, waiting on something, finished or failed)."""

    def __init__(self, size, eager, timeout=TIMEOUT):
        self.size, self.eager = size, eager
        self.changed = threading.Condition()
        self.waits = {}                      # world rank -> (description, ready())
        self.ended = {}                      # world rank -> "finished" or "failed: ..."
        self.failure = None                  # the report, once a deadlock is found
        self.deadline = time.monotonic() + timeout

    def wait_until(self, rank, what, ready):
        """Block world rank ``rank`` until ``ready()``; raise :class:`Deadlock` if that can
        no longer happen. ``what`` says what the rank waits for, for the report."""
        with self.changed:
            self.waits[rank] = (what, ready)
            try:
                while not ready():
                    self._raise_if_stuck()
                    self.changed.wait(timeout=0.5)
            finally:
                del self.waits[rank]

    def notify(self):
        """Wake every waiting rank to look again (call with ``changed`` held)."""
        self.changed.notify_all()

    def end(self, rank, outcome):
        """World rank ``rank`` returned or raised: it will post nothing more."""
        with self.changed:
            self.ended[rank] = outcome
            self.changed.notify_all()

    def report(self):
        """One line per rank: what it waits for, or how it ended, or that it runs."""
        lines = []
        for rank in range(self.size):
            if rank in self.waits:
                state = f"waits in {self.waits[rank][0]}"
            else:
                state = self.ended.get(rank, "running")
            lines.append(f"  rank {rank}: {state}")
        return "\n".join(lines)

    def _raise_if_stuck(self):
        if self.failure is None:
            if self._stuck():
                self.failure = (f"deadlock with eager limit {self.eager} B: every live rank "
                                f"waits and none can go on\n{self.report()}")
                self.changed.notify_all()
            elif time.monotonic() > self.deadline:
                self.failure = f"no progress before the run's time limit\n{self.report()}"
        if self.failure is not None:
            raise Deadlock(self.failure)

    def _stuck(self):
        live = self.size - len(self.ended)
        return len(self.waits) == live and not any(ready() for _, ready in self.waits.values())


class Group:
    """What the ranks of one communicator share: its message channels, its collectives and
    the communicators split from it."""

    def __init__(self, world, members, name):
        self.world, self.members, self.name = world, members, name   # members: world ranks
        self.channels = {}        # (source, dest, tag) -> Channel
        self.rounds = {}          # collective number -> {rank: value}
        self.children = {}        # (split number, color) -> Group

    def channel(self, source, dest, tag):
        """The channel of (source, dest, tag), made on first use (call with the lock held)."""
        return self.channels.setdefault((source, dest, tag), Channel())

    def describe(self, rank):
        """``rank`` of this communicator, as the report names it."""
        if self.name == "world":
            return f"rank {rank}"
        return f"rank {rank} of {self.name} (world rank {self.members[rank]})"


class Channel:
    """Sends and receives of one (source, dest, tag) that have not met yet, in post order."""

    def __init__(self):
        self.sends, self.recvs = deque(), deque()


class Request:
    """One posted send or receive; ``Wait`` blocks until it is complete."""

    def __init__(self, world, rank, what, data):
        self.world, self.rank, self.what, self.data = world, rank, what, data
        self.done, self.error = False, None

    def Wait(self):
        """Block until the message has been matched (a synchronous send, a receive)."""
        self.world.wait_until(self.rank, self.what, lambda: self.done)
        if self.error:
            raise AssertionError(self.error)


def waitall(requests):
    """``MPI.Request.Waitall`` for the fake's requests."""
    for request in requests:
        request.Wait()


class FakeComm:
    """One rank's view of an in-memory communicator (the calls our algorithms make)."""

    def __init__(self, group, rank):
        self.group, self.rank, self.size = group, rank, len(group.members)
        self.world, self.me = group.world, group.members[rank]
        self.splits = self.collectives = 0

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Free(self):
        pass

    # --- point to point ---------------------------------------------------------------------

    def Isend(self, buf, dest, tag=0):
        data = _bytes(buf)
        what = (f"Send of {data.size} B to {self.group.describe(dest)}, tag {tag} "
                f"({'eager' if self._eager(data) else 'synchronous'})")
        send = Request(self.world, self.me, what, data)
        with self.world.changed:
            if self._eager(data):    # buffered: complete now, whatever follows
                send.data, send.done = data.copy(), True
            channel = self.group.channel(self.rank, dest, tag)
            if channel.recvs:
                _deliver(send, channel.recvs.popleft())
            else:
                channel.sends.append(send)
            self.world.notify()
        return send

    def _eager(self, data):
        return 0 < self.world.eager and data.size <= self.world.eager

    def Irecv(self, buf, source, tag=0):
        if source < 0 or tag < 0:
            raise NotImplementedError("the fake matches named sources and tags only")
        data = _bytes(buf)
        what = f"Recv of {data.size} B from {self.group.describe(source)}, tag {tag}"
        recv = Request(self.world, self.me, what, data)
        with self.world.changed:
            channel = self.group.channel(source, self.rank, tag)
            if channel.sends:
                _deliver(channel.sends.popleft(), recv)
            else:
                channel.recvs.append(recv)
            self.world.notify()
        return recv

    def Send(self, buf, dest, tag=0):
        self.Isend(buf, dest, tag).Wait()

    def Recv(self, buf, source, tag=0):
        self.Irecv(buf, source, tag).Wait()

    def Sendrecv(self, sendbuf, dest, sendtag, recvbuf, source, recvtag):
        # Both posted before either is waited for: what keeps Sendrecv from deadlocking.
        send = self.Isend(sendbuf, dest, sendtag)
        recv = self.Irecv(recvbuf, source, recvtag)
        send.Wait()
        recv.Wait()

    # --- the collectives that set-ups use ---------------------------------------------------

    def allgather(self, value):
        """Every rank's ``value``, in rank order."""
        number, self.collectives = self.collectives, self.collectives + 1
        with self.world.changed:
            values = self.group.rounds.setdefault(number, {})
            values[self.rank] = value
            self.world.notify()
        self.world.wait_until(self.me, f"collective #{number} on {self.group.name}",
                              lambda: len(values) == self.size)
        return [values[r] for r in range(self.size)]

    def allreduce(self, value, op):
        assert op is MPI.MIN, op
        return min(self.allgather(value))

    def Split(self, color, key=0):
        entries = self.allgather((color, key))
        number, self.splits = self.splits, self.splits + 1
        if color == MPI.UNDEFINED:
            return None
        order = sorted((k, r) for r, (c, k) in enumerate(entries) if c == color)
        members = tuple(self.group.members[r] for _, r in order)
        name = f"{self.group.name}/split{number}:{color}"
        with self.world.changed:
            group = self.group.children.setdefault((number, color),
                                                   Group(self.world, members, name))
        return FakeComm(group, order.index((key, self.rank)))

    def Split_type(self, split_type, key=0):
        return self.Split(0, key)    # one machine: one node


def _bytes(buf):
    """The bytes of a message: an array, ``[array, datatype]`` or an ``MPI.buffer``."""
    if isinstance(buf, (list, tuple)):
        buf = buf[0]
    return np.frombuffer(buf, dtype=np.uint8)


def _deliver(send, recv):
    """Copy a matched send into its receive and complete both (with the lock held)."""
    if send.data.size != recv.data.size:
        recv.error = f"{recv.what}: the message has {send.data.size} B"
    else:
        recv.data[...] = send.data
    send.done = recv.done = True


def run_ranks(size, rank_main, eager, timeout=TIMEOUT):
    """``rank_main(comm)`` on ``size`` threads over one fake communicator of ``eager`` bytes'
    eager limit; every rank's result, in rank order. A rank's error is raised here (the
    first rank's that is not a :class:`Deadlock`, which the others' waits then became),
    else the :class:`Deadlock`."""
    world = World(size, eager, timeout)
    group = Group(world, tuple(range(size)), "world")
    results, errors = [None] * size, {}

    def main(rank):
        try:
            results[rank] = rank_main(FakeComm(group, rank))
        except Exception as exc:
            errors[rank] = exc
        world.end(rank, f"failed: {errors[rank]!r}" if rank in errors else "finished")

    threads = [threading.Thread(target=main, args=(r,), daemon=True) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(world.deadline - time.monotonic(), 0) + 5)
    if any(thread.is_alive() for thread in threads):
        raise Deadlock(f"ranks still running past the time limit\n{world.report()}")
    for rank, exc in sorted(errors.items()):
        if not isinstance(exc, Deadlock):
            raise AssertionError(f"rank {rank} of {size}: {exc!r}") from exc
    if errors:
        raise min(errors.items())[1]
    return results
