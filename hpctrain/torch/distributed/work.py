"""What an operation of the ``hpctrain`` process group hands back to ``torch.distributed``: a
:class:`Work` over one of the engine's handles, whose torch future is completed on the thread
that finishes the handle (the communication thread for collectives, the point-to-point
thread for send and recv).

DDP's reducer waits on the future (``getFuture()``), never on the work, so the future must
complete by itself, without anyone calling :meth:`Work.wait`: :class:`FutureHandle` completes
it in :meth:`~hpctrain.torch.engine.Handle.finish`, the one place every operation ends,
whether it ran, failed on every rank (a mismatch, a deadlock) or was failed by a shutdown.
"""

import datetime

import torch
import torch.distributed as dist

from ..engine import Handle
from ..ops.common import synchronize


def seconds(timeout):
    """A ``timedelta``'s seconds; ``None`` for none, or for torch's "not set" (negative)."""
    if isinstance(timeout, datetime.timedelta) and timeout >= datetime.timedelta(0):
        return timeout.total_seconds()
    return None


class FutureHandle(Handle):
    """An engine :class:`~hpctrain.torch.engine.Handle` that also completes a torch future:
    with ``value(result)`` when the operation ran, with its exception when it failed.

    The future handed out is a ``then`` of a private one, whose callback returns the value
    or raises the error: the one way Python has to fail a torch future that C++ sees as
    failed. ``Future.set_exception`` stores the exception as the future's *value* (Python's
    ``wait`` raises it, C++ does not): DDP's reducer then takes the exception for its
    gradients and crashes the process (seen: a segmentation fault in
    ``parseCppCommHookResult`` after a rank died). So a failed operation raises
    ``RuntimeError`` from ``future.wait()`` and from DDP's backward, as gloo's do.
    """

    __slots__ = ("future", "value", "_ended")

    def __init__(self, value):
        super().__init__()
        self._ended = torch.futures.Future()
        self.future = self._ended.then(self._outcome)
        self.value = value

    def _outcome(self, _):
        if self.error is not None:
            raise self.error
        return self.value(self.result[0])

    def finish(self, result=None, error=None):
        """Complete the future, then the operation (on the finishing thread): whoever
        ``wait()`` wakes finds the future done too."""
        self.result, self.error = result, error     # what _outcome reads
        self._ended.set_result(None)
        super().finish(result, error)


class Work(dist._Work):
    """``torch.distributed``'s handle of one operation: ``wait()`` raises the operation's
    error, ``get_future()`` completes by itself, ``_source_rank()`` is the sender of a
    receive from any source."""

    def __init__(self, handle):
        super().__init__()
        self.handle = handle

    def wait(self, timeout=None):
        """Block until the operation has ended; raise its error, else return True.

        ``timeout`` (a ``timedelta``; zero, torch's default, is none): raise ``RuntimeError``
        if the operation has not ended by then. The operation itself goes on (its own
        timeout, the group's, still applies): a later ``wait()`` finds its outcome."""
        limit = seconds(timeout)
        if limit and not self.handle.done.wait(limit):
            raise RuntimeError(f"Work.wait: Timed out waiting {limit * 1000:.0f}ms for the "
                               f"operation to complete (wait's timeout of {limit:g} s); it "
                               f"is still in flight and a later wait() gives its outcome")
        # Handle.wait counts this thread as blocked, which the engine's deadlock verdict
        # needs (every rank waiting for a name another rank never asks for); synchronize
        # also orders the caller's CUDA stream after the operation's.
        synchronize(self.handle)
        return True

    def is_completed(self):
        """True once the operation has ended (ran or failed)."""
        return self.handle.done.is_set()

    def is_success(self):
        """True once the operation has ended without error."""
        return self.is_completed() and self.handle.error is None

    def exception(self):
        """The operation's error, or ``None``."""
        return self.handle.error

    def get_future(self):
        """A ``torch.futures.Future`` completed when the operation ends."""
        return self.handle.future

    def result(self):
        """The operation's output tensors (waits for them)."""
        self.wait()
        return self.handle.future.value()

    def synchronize(self):
        """As :meth:`wait` (CPU: nothing more to order)."""
        self.wait()

    def _source_rank(self):
        return synchronize(self.handle)

    def source_rank(self):
        """The group rank a receive from any source got its message from."""
        return self._source_rank()
