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
who died. There is no timeout: a receive whose sender never sends waits, as MPI's does.
"""

import threading
import time

import torch

from .work import FutureHandle, Work
from ..engine import ProcessFailure, lost, process_failure

#: Seconds between tests of the posted requests while any are in flight.
POLL_S = 0.0001


class Progress:
    """The thread that completes posted point-to-point requests (one per process, started
    at the first post, idle without requests)."""

    def __init__(self):
        self._posted = []               # (MPI request, communicator, finish) triples
        self._lock = threading.Condition()
        self._thread = None

    def post(self, request, comm, finish):
        """Hand ``request`` (posted on ``comm``) over; ``finish(status, error)`` runs on this
        thread once it completes or fails."""
        with self._lock:
            self._posted.append((request, comm, finish))
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
            done = []
            for request, comm, finish in posted:
                status = MPI.Status()
                try:
                    complete = request.Test(status)
                except Exception as exc:  # noqa: BLE001 - the waiting caller hears of it
                    finish(None, failure(comm, exc))
                    done.append(request)
                    continue
                if complete:
                    finish(status, None)
                    done.append(request)
            with self._lock:
                self._posted = [p for p in self._posted if p[0] not in done]
            if not done:
                time.sleep(POLL_S)


PROGRESS = Progress()


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


def send(comm, tensor, peer, tag):
    """Post the send of ``tensor`` to group rank ``peer``; return its :class:`Work`."""
    host = _host_view(tensor)
    handle = FutureHandle(lambda result: [tensor])
    request = _posted(comm, lambda: comm.Isend(_bytes(host), dest=peer, tag=tag))
    # ``host`` stays referenced by the closure until MPI is done with it.
    PROGRESS.post(request, comm,
                  lambda status, error, keep=host: handle.finish((None, None), error))
    return Work(handle)


def recv(comm, tensor, peer, tag):
    """Post the receive of ``tensor`` from group rank ``peer`` (``None``: any rank); return
    its :class:`Work`, whose ``_source_rank()`` is the sender once it completes."""
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
    PROGRESS.post(request, comm, finish)
    return Work(handle)
