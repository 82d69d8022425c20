"""Gradient buckets reduced while backward runs, for the parameter-server regimes.

The allreduce regime uses :class:`hpctrain.torch.DistributedOptimizer`; the parameter
servers reduce onto one rank (``Reduce``) or onto shards (``Reduce_scatter``), which no
allreduce optimizer offers, so they drive their buckets here with their own ``reduce``.
Buckets are cut and packed as everywhere else (:mod:`hpctrain.torch.buckets`).

A hook on every parameter (``register_post_accumulate_grad_hook``) copies its gradient into
the bucket's flat buffer as soon as autograd has finished it; when a bucket is complete it
is queued for the one communication thread, which reduces buckets strictly in bucket order
while backward goes on computing the earlier layers. ``wait`` then blocks until every bucket
is reduced and copies the results back into ``param.grad``.

Why one thread and a fixed order: every bucket's reduction is a collective, and collectives
must be issued in the same order on every rank. Bucket assignment depends only on the
parameters' registration order (the same on every rank by construction), and the thread
never reduces bucket i+1 before bucket i, even if i+1 filled first; so the order is the
same everywhere whatever the hooks' timing. The main thread makes no MPI call while the
communication thread works, so MPI_THREAD_SERIALIZED is enough (mpi4py asks for MULTIPLE).

Timing: ``comm_seconds`` adds up how long reductions took on the communication thread;
``wait`` returns how long the main thread waited for them after backward, the *exposed*
communication. Their difference is the communication hidden behind backward.
"""

import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from ..torch.buckets import FlatBuffer, assign_buckets

__all__ = ["Bucket", "BucketReducer", "assign_buckets"]


@dataclass
class Bucket:
    """Parameters whose gradients are reduced together through one flat buffer."""

    index: int
    names: list
    params: list
    buffer: FlatBuffer
    ready: list = field(default_factory=list)
    pending: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def flat(self):
        """The bucket's flat vector."""
        return self.buffer.flat


class BucketReducer:
    """Reduce the gradients of ``named_params`` bucket by bucket with ``reduce(flat, bucket)``.

    ``reduce`` reduces ``bucket.flat`` in place (e.g. a reduce onto rank 0); it runs on the
    communication thread when ``overlap`` is true, else in ``wait`` on the calling thread.
    Buffers live in host memory: they are handed to MPI as NumPy views.
    """

    def __init__(self, named_params, reduce, bucket_mb, overlap=True):
        named = [(n, p) for n, p in named_params if p.requires_grad]
        self.reduce, self.overlap = reduce, overlap
        self.buckets = [Bucket(i, [n for n, _ in group], [p for _, p in group],
                               FlatBuffer([p for _, p in group], device=torch.device("cpu")))
                        for i, group in enumerate(assign_buckets(named, int(bucket_mb * 2**20)))]
        self._where = {id(p): (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._lock = threading.Lock()
        self._next = 0          # the next bucket to queue; buckets are queued in order
        self._queue = queue.SimpleQueue()
        self._error = None
        self.comm_seconds = 0.0
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready)
                       for _, p in named]
        self._thread = None
        if overlap:
            self._thread = threading.Thread(target=self._serve, name="hpctrain-grad-comm",
                                            daemon=True)
            self._thread.start()
        self._reset()

    def _reset(self):
        for bucket in self.buckets:
            bucket.ready = [False] * len(bucket.params)
            bucket.pending = len(bucket.params)
            bucket.done.clear()
        self._next = 0

    def _grad_ready(self, param):
        bucket, i = self._where[id(param)]
        with self._lock:  # autograd may run hooks on its device threads (CUDA)
            if bucket.ready[i]:
                raise RuntimeError(f"gradient of {bucket.names[i]} produced twice in one step: "
                                   f"call wait() after every backward")
            bucket.buffer.slot(i).copy_(param.grad.detach())
            bucket.ready[i] = True
            bucket.pending -= 1
            if self.overlap:
                self._queue_ready()

    def _queue_ready(self):
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self._queue.put(self.buckets[self._next])
            self._next += 1

    def _serve(self):
        while True:
            bucket = self._queue.get()
            if bucket is None:
                return
            self._reduce(bucket)

    def _reduce(self, bucket):
        try:
            if self._error is None:
                start = time.perf_counter()
                self.reduce(bucket.flat, bucket)
                self.comm_seconds += time.perf_counter() - start
        except BaseException as exc:  # noqa: B036 - re-raised on the main thread by wait()
            # A failure here must reach the main thread, which would otherwise wait forever.
            self._error = exc
        finally:
            bucket.done.set()

    def wait(self):
        """Block until every bucket is reduced, write ``param.grad``; return the seconds waited.

        Buckets whose parameters got no gradient in this backward (unused parameters) are
        reduced with zeros for them, so that every rank still reduces every bucket.
        """
        start = time.perf_counter()
        with self._lock:
            for bucket in self.buckets:
                self._fill_missing(bucket)
            if self.overlap:
                self._queue_ready()
        for bucket in self.buckets:
            if self.overlap:
                bucket.done.wait()
            else:
                self._reduce(bucket)
        waited = time.perf_counter() - start
        if self._error is not None:
            error, self._error = self._error, None
            self._reset()
            raise error
        self._unpack()
        self._reset()
        return waited

    def _fill_missing(self, bucket):
        for i, ready in enumerate(bucket.ready):
            if not ready:
                bucket.buffer.slot(i).zero_()
        bucket.pending = 0

    def _unpack(self):
        for bucket in self.buckets:
            for p in bucket.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            bucket.buffer.unpack([p.grad for p in bucket.params])

    def close(self, wait=True):
        """Remove the hooks and stop the communication thread.

        ``wait=False`` after a failure: the thread may be blocked in a collective that the
        other ranks will never join, so it is left to die with the process.
        """
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._thread is not None:
            self._queue.put(None)
            if wait:
                self._thread.join()
            self._thread = None
