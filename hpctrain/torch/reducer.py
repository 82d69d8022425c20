"""Gradients handed over bucket by bucket while backward runs: hpctrain's one gradient path.

:class:`BucketReducer` cuts the parameters into buckets of about ``bucket_bytes``, in reverse
registration order (:func:`~hpctrain.torch.buckets.assign_buckets`: backward produces the
last layer's gradients first), one flat buffer each (:mod:`hpctrain.torch.buckets`). A hook
per parameter (``register_post_accumulate_grad_hook``) counts the gradients autograd has
finished, ``passes`` backward passes per step; when all of a bucket's are there, the bucket
is handed to ``submit(bucket)``, which queues its operation on hpctrain.torch's
communication thread and returns a handle. :meth:`BucketReducer.synchronize` hands over the
buckets left (parameters without a gradient take part as zeros) and waits for every handle.

What a bucket's operation does is the caller's: :class:`hpctrain.torch.DistributedOptimizer`
allreduces it; the parameter servers of ``hpctrain train`` reduce it onto one rank or onto
shards (:mod:`hpctrain.train.regimes`). Copying the gradients into the buffer is part of the
operation, so that it runs on the communication thread beside backward.

Buckets are handed over in bucket order only, never bucket i+1 before bucket i whatever the
hooks' timing: every rank then issues the same operations in the same order (the engine
pairs them by name, but a fixed order also keeps each rank's queue short and predictable).
"""

import queue
import threading

from .buckets import assign_buckets, FlatBuffer
from .engine import Handle
from .ops.common import caller_event


class Bucket:
    """Parameters whose gradients travel together through one flat buffer."""

    __slots__ = ("index", "names", "params", "buffer", "pending", "handle", "event", "sparse",
                 "operation", "in_place")

    def __init__(self, index, named, device=None):
        self.index = index
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.buffer = FlatBuffer(self.params, device=device)
        self.pending, self.handle, self.event = len(self.params), None, None
        self.sparse = ()        # places whose gradient was sparse in this step
        self.operation = None   # the caller's, made once (DistributedOptimizer: its operation)
        self.in_place = False   # this step's values were reduced in the gradient, not the buffer

    @property
    def flat(self):
        """The bucket's flat vector."""
        return self.buffer.flat

    def gradients(self):
        """The parameters' gradients, ``None`` where there is none."""
        return [p.grad for p in self.params]


class BucketReducer:
    """Hand the gradients of ``named`` (``(name, param)`` pairs) to ``submit`` bucket by bucket.

    ``submit(bucket)`` queues the bucket's operation and returns a handle whose ``wait()``
    returns its result or raises its error. ``overlap``: hand each bucket over as soon as its
    gradients are there (else all of them in :meth:`synchronize`). ``device``: where the
    buffers live (default: the parameters'). ``skip``: count gradients but hand nothing over
    (an average over one rank is the gradient itself).
    """

    def __init__(self, named, bucket_bytes, submit, *, passes=1, overlap=True, device=None,
                 skip=False):
        wanted = [(n, p) for n, p in named if p.requires_grad]
        self.buckets = [Bucket(i, group, device)
                        for i, group in enumerate(assign_buckets(wanted, bucket_bytes))]
        self.submit, self.passes, self.overlap, self.skip = submit, passes, overlap, skip
        self._where = {p: (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._left = {p: passes for p in self._where}
        self._next = 0          # the next bucket to hand over
        self._lock = threading.Lock()     # autograd may run hooks on its device threads
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready)
                       for p in self._where]

    def _grad_ready(self, param):
        bucket, _ = self._where[param]
        with self._lock:
            if self._left[param] == 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "call to step(). Increase backward_passes_per_step to accumulate "
                    "gradients locally.")
            self._left[param] -= 1
            if self._left[param]:
                return      # accumulate locally for another backward pass
            bucket.pending -= 1
            if bucket.pending == 0 and not self.skip:
                bucket.event = caller_event(bucket.params[:1])
                if self.overlap:
                    self._hand_over()

    def _hand_over(self):
        # In bucket order only: a later bucket that filled first waits for the earlier ones.
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            bucket = self.buckets[self._next]
            bucket.handle = self.submit(bucket)
            self._next += 1

    @property
    def in_step(self):
        """Whether some gradient of this step has been counted and not yet synchronized."""
        return any(left != self.passes for left in self._left.values())

    def synchronize(self):
        """Hand over the buckets left and wait for all; their results, in bucket order.

        Synchronisation point: every bucket's operation. Parameters that got no gradient
        in this step take part as zeros (their buffer places are packed from ``None``).
        """
        if self.skip:
            self.reset()
            return [None] * len(self.buckets)
        try:
            with self._lock:
                for bucket in self.buckets:
                    if bucket.pending:
                        bucket.pending = 0
                        bucket.event = caller_event(bucket.params[:1])
                self._hand_over()
            return [bucket.handle.wait() for bucket in self.buckets]
        finally:
            self.reset()

    def reset(self):
        """Forget this step's gradients: the next backward starts a new step."""
        for bucket in self.buckets:
            bucket.pending, bucket.handle = len(bucket.params), None
        for p in self._left:
            self._left[p] = self.passes
        self._next = 0

    def close(self):
        """Remove the hooks: backward no longer hands anything over."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


class InOrder:
    """A thread that runs operations in the order they are submitted, with no negotiation:
    for users whose ranks submit the same operations in the same order by construction
    (the parameter servers' buckets). ``submit(run)`` returns a handle of ``run()``."""

    def __init__(self, name="hpctrain-in-order"):
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, run):
        """Queue ``run`` (no arguments); return its handle."""
        handle = Handle()
        self._queue.put((run, handle))
        return handle

    def _serve(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            run, handle = item
            try:
                handle.finish(run())
            except BaseException as exc:  # noqa: B036 - handed to the caller that waits
                handle.finish(error=exc)

    def close(self, wait=True):
        """Stop the thread after what is queued (``wait=False``: do not wait for it; it may
        be blocked in a collective that other ranks will never join)."""
        self._queue.put(None)
        if wait:
            self._thread.join()
