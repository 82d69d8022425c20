"""Point-to-point for the ``hpctrain`` process group: ``send``, ``recv`` (from one rank or
any), and so ``isend``, ``irecv`` and ``batch_isend_irecv``.

A send or receive is posted at once, on the caller's thread, as a non-blocking MPI call on
the group's own point-to-point communicator (a duplicate made with the group, so no
collective's message can match it, and c10d's tags stay the user's). MPI keeps the messages
of one sender to one receiver with one tag in order, which is c10d's contract. One thread
per process (:class:`Progress`) tests the posted requests and finishes each one's handle,
which completes its torch future: futures complete whether or not anyone waits on the work.

CUDA tensors are staged through host memory (MPI's point-to-point is given host buffers only).

With a fault-tolerant MPI, a rank's death fails the posted requests: those involving it at
once, the others when the world revokes its communicators, these among them
(``World.duplicates``); each with a :class:`~hpctrain.torch.engine.ProcessFailure` that says
who died.

Each send and receive has its group's ``timeout``, as gloo's have: a receive that no message
has matched by then is cancelled and fails (``Timed out waiting ...ms for recv operation to
complete``, gloo's words); a send that no receive has taken by then fails too, while MPI keeps
its request (a send cannot be cancelled) and this thread keeps its buffer until it completes
or the process ends. Only the rank whose operation expired raises; its peer, if it waits
for something else, is ended by hpctrain's guard when the raising rank exits.
"""

import threading
import time

import torch

from .work import FutureHandle, Work
from ..engine import ProcessFailure, lost
from ...mpi.ulfm import process_failure

#: Seconds between tests of the posted requests while any are in flight.
POLL_S = 0.0001
#: ... while only expired sends are (MPI keeps them until a receive takes them).
EXPIRED_POLL_S = 0.01


class Posted:
    """One request in flight: its communicator, ``finish(status, error)``, its timeout and
    deadline (``time.monotonic()``; ``None``: none), what it is (``"send"`` or ``"recv"``,
    and ``describe``: its peer and tag, for the timeout's message), and whether it expired
    already (a cancelled receive being completed, or an abandoned send)."""

    __slots__ = ("request", "comm", "finish", "timeout", "deadline", "what", "describe",
                 "expired")

    def __init__(self, request, comm, finish, timeout, what, describe):
        self.request, self.comm, self.finish, self.what = request, comm, finish, what
        self.timeout, self.describe = timeout, describe
        self.deadline = None if not timeout else time.monotonic() + timeout
        self.expired = False


class Progress:
    """The thread that completes posted point-to-point requests (one per process, started
    at the first post, idle without requests)."""

    def __init__(self):
        self._posted = []               # Posted, in the order they came
        self._lock = threading.Condition()
        self._thread = None

    def post(self, request, comm, finish, timeout=None, what="recv", describe=""):
        """Hand ``request`` (posted on ``comm``) over; ``finish(status, error)`` runs on this
        thread once it completes, fails, or has not completed within ``timeout`` seconds
        (``None`` or 0: no limit). ``what``: ``"send"`` or ``"recv"``; ``describe``: its
        peer and tag."""
        with self._lock:
            self._posted.append(Posted(request, comm, finish, timeout, what, describe))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="hpctrain-p2p",
                                                daemon=True)
                self._thread.start()
            self._lock.notify()

    def _serve(self):
        from mpi4py import MPI

        while True:
            with self._lock:
                while not self._posted:
                    self._lock.wait()
                posted = list(self._posted)
            done = [p for p in posted if self._advance(p, MPI)]
            with self._lock:
                self._posted = [p for p in self._posted if p not in done]
            if not done:
                time.sleep(POLL_S if any(not p.expired for p in posted) else EXPIRED_POLL_S)

    @staticmethod
    def _advance(posted, MPI):  # noqa: N803 - the module
        """Test one request; True once it is finished with (its handle finished, and MPI
        done with its buffer)."""
        status = MPI.Status()
        try:
            complete = posted.request.Test(status)
        except Exception as exc:  # noqa: BLE001 - the waiting caller hears of it
            if not posted.expired:
                posted.finish(None, failure(posted.comm, exc))
            return True
        if complete:
            if posted.what == "recv" and status.Is_cancelled():
                posted.finish(None, timed_out(posted))
            elif not (posted.expired and posted.what == "send"):
                # (a receive whose cancel came too late completed: it succeeded)
                posted.finish(status, None)
            return True
        if posted.expired or posted.deadline is None or time.monotonic() < posted.deadline:
            return False
        posted.expired = True
        if posted.what == "recv":
            posted.request.Cancel()       # completes, cancelled or matched: tested above
        else:
            posted.finish(None, timed_out(posted))
        return False


PROGRESS = Progress()


def timed_out(posted):
    """The error of a send or receive that did not complete within its group's timeout
    (worded as gloo's, which torch's tests recognise)."""
    late = ("no receive has taken it; MPI keeps the send until one does"
            if posted.what == "send" else "no message matched it; it was cancelled")
    return RuntimeError(f"dist.{posted.what} {posted.describe}: Timed out waiting "
                        f"{posted.timeout * 1000:.0f}ms for {posted.what} operation to "
                        f"complete: not done within its process group's timeout of "
                        f"{posted.timeout:g} s ({late})")


def failure(comm, exc):
    """The error a send or receive on ``comm`` ends with when MPI raised ``exc``: with a
    fault-tolerant MPI, a rank's death (or the revoke that follows it) is a
    :class:`~hpctrain.torch.engine.ProcessFailure` that says who died, as the collectives'."""
    if process_failure(exc):
        return ProcessFailure(lost(comm, exc))
    return exc


def _host_view(tensor):
    """A contiguous host tensor with ``tensor``'s bytes (``tensor`` itself where it is one)."""
    if tensor.is_cuda:
        return tensor.detach().to("cpu").contiguous()
    return tensor.detach().contiguous()


def _bytes(tensor):
    return tensor.detach().view(-1).view(torch.uint8).numpy() if tensor.numel() else \
        bytearray()


def _posted(comm, post):
    """``post()``'s request; a death MPI reports already is raised as :func:`failure`."""
    try:
        return post()
    except Exception as exc:  # noqa: BLE001 - re-raised, said better where it is a death
        raise failure(comm, exc) from exc


def send(comm, tensor, peer, tag, timeout=None):
    """Post the send of ``tensor`` to group rank ``peer``; return its :class:`Work`, which
    fails if no receive has taken it within ``timeout`` seconds (``None``: no limit)."""
    host = _host_view(tensor)
    handle = FutureHandle(lambda result: [tensor])
    request = _posted(comm, lambda: comm.Isend(_bytes(host), dest=peer, tag=tag))
    # ``host`` stays referenced by the closure until MPI is done with it.
    PROGRESS.post(request, comm,
                  lambda status, error, keep=host: handle.finish((None, None), error),
                  timeout, "send", f"to rank {peer} (tag {tag})")
    return Work(handle)


def recv(comm, tensor, peer, tag, timeout=None):
    """Post the receive of ``tensor`` from group rank ``peer`` (``None``: any rank); return
    its :class:`Work`, whose ``_source_rank()`` is the sender once it completes; cancelled
    and failed if no message has matched it within ``timeout`` seconds (``None``: no
    limit)."""
    from mpi4py import MPI

    host = tensor if (not tensor.is_cuda and tensor.is_contiguous()) else \
        torch.empty(tensor.shape, dtype=tensor.dtype)
    handle = FutureHandle(lambda result: [tensor])
    source = MPI.ANY_SOURCE if peer is None else peer
    request = _posted(comm, lambda: comm.Irecv(_bytes(host), source=source, tag=tag))

    def finish(status, error):
        if error is None and host is not tensor:
            tensor.copy_(host)
        handle.finish(None if status is None else (status.Get_source(), None), error)
    PROGRESS.post(request, comm, finish, timeout, "recv",
                  f"from {'any rank' if peer is None else f'rank {peer}'} (tag {tag})")
    return Work(handle)
