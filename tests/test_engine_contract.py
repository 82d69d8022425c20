"""The engine's thread contract, on one rank (``COMM_SELF``): what a caller's thread may do
while the communication thread ends, and which thread touches the timeline.

A request submitted while the engine ends must fail, never wait for ever: ``submit`` checks
that the engine still runs and then queues; if the end ran in between (drained the queue,
failed what it found), a request queued after it would be in nobody's hands. The first test
pauses ``submit`` exactly there (the request's ``key`` is read right after the check) while
the communication thread ends.
"""

import threading
import time
from types import SimpleNamespace

import pytest
from mpi4py import MPI

from hpctrain.torch.engine import Engine, HorovodInternalError, Request
from hpctrain.torch.ops.common import signature


@pytest.fixture
def engine():
    comm = MPI.COMM_SELF.Dup()
    engine = Engine(comm, {0: SimpleNamespace(ranks=[0], comm=comm)}, {})
    yield engine
    engine.close()
    comm.Free()


def echo(comm, infos):
    return "ran"


def test_a_request_submitted_while_the_engine_ends_fails_instead_of_waiting(engine):
    checked, go = threading.Event(), threading.Event()

    class PausedAfterTheCheck(Request):
        __slots__ = ()

        @property
        def key(self):
            if not checked.is_set():
                checked.set()
                go.wait(10)
            return (self.set_id, self.name)

    request = PausedAfterTheCheck(0, "late", signature("allreduce"), "late", echo)
    outcome = {}

    def submit():
        # Paused after the check, so it is queued, not refused: the end must fail it.
        outcome["handle"] = engine.submit(request)

    caller = threading.Thread(target=submit)
    caller.start()
    assert checked.wait(10), "submit never read the request's key"
    # The thread ends as when another rank's shutdown reaches it: without this rank's
    # queue, whose lock the paused submit holds.
    engine.close(wait=False)
    time.sleep(0.5)             # the end runs now, unless submit holds it off
    go.set()
    caller.join(10)
    assert not caller.is_alive() and "handle" in outcome
    handle = outcome["handle"]
    assert handle.done.wait(10), "the request was queued after the end and waits for ever"
    with pytest.raises(HorovodInternalError, match="shut down"):
        handle.wait()


def test_after_the_end_every_request_is_refused_at_once(engine):
    engine.close()
    with pytest.raises(HorovodInternalError, match="shut down"):
        engine.submit(Request(0, "after", signature("allreduce"), "after", echo))
    with pytest.raises(HorovodInternalError, match="shut down"):
        engine.join()


class ThreadNotingTimeline:
    """A timeline that notes which thread called each of its methods."""

    def __init__(self):
        self.calls = []

    def _note(self, what):
        self.calls.append((what, threading.current_thread().name))

    def begin(self, *args):
        self._note("begin")

    def end(self, *args):
        self._note("end")

    def mark_cycle(self):
        self._note("mark_cycle")

    def flush(self):
        self._note("flush")

    def close(self):
        self._note("close")


def test_the_timeline_is_swapped_and_written_on_the_communication_thread_only(engine):
    first, second = ThreadNotingTimeline(), ThreadNotingTimeline()
    engine.set_timeline(first)
    assert engine.submit(Request(0, "one", signature("allreduce"), "one", echo)).wait() == "ran"
    engine.set_timeline(second)             # returns once the first is closed
    assert first.calls[-1][0] == "close"
    assert engine.submit(Request(0, "two", signature("allreduce"), "two", echo)).wait() == "ran"
    engine.set_timeline(None)
    for timeline in (first, second):
        kinds = [what for what, _ in timeline.calls]
        assert kinds.count("begin") == 2 and kinds.count("end") == 2 and kinds[-1] == "close"
        assert {thread for _, thread in timeline.calls} == {"hpctrain-comm"}


class Counted:
    """A timeline that counts its closes."""

    def __init__(self):
        self.closed = 0

    def mark_cycle(self):
        pass

    def flush(self):
        pass

    def close(self):
        self.closed += 1


def test_a_swap_after_the_end_and_the_threads_last_swap_close_each_timeline_once():
    # After the end, set_timeline swaps on the caller's thread while the communication
    # thread's last act swaps to None. Here each pauses inside its swap, between reading the
    # timeline it replaces and storing the new one, until the other has read too: without
    # the swap's lock both read the same timeline and both close it.
    at_last_swap, caller_read, thread_swapped = (threading.Event() for _ in range(3))

    class PausingEngine(Engine):
        @property
        def timeline(self):
            value = self.__dict__.get("_timeline")
            if self.__dict__.get("armed") and self.pending.ended:
                if threading.current_thread().name == "hpctrain-comm":
                    at_last_swap.set()
                    caller_read.wait(2)         # the lock keeps the caller out: 2 s, then on
                    value = self.__dict__.get("_timeline")
                else:
                    caller_read.set()
                    thread_swapped.wait(1)
            return value

        @timeline.setter
        def timeline(self, value):
            self.__dict__["_timeline"] = value
            if threading.current_thread().name == "hpctrain-comm" and self.pending.ended:
                thread_swapped.set()

    comm = MPI.COMM_SELF.Dup()
    engine = PausingEngine(comm, {0: SimpleNamespace(ranks=[0], comm=comm)}, {})
    try:
        first, second = Counted(), Counted()
        engine.set_timeline(first)
        engine.__dict__["armed"] = True
        engine.close(wait=False)
        assert at_last_swap.wait(10), "the communication thread never reached its last swap"
        engine.set_timeline(second)             # the engine has ended: swapped here
        engine._thread.join(10)
        assert not engine._thread.is_alive()
        assert first.closed == 1, f"the first timeline was closed {first.closed} times"
        engine.set_timeline(None)
        assert second.closed == 1
    finally:
        engine.close()
        comm.Free()
