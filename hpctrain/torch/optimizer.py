"""``DistributedOptimizer``: gradients averaged in buckets while backward runs.

The buckets, their hooks and their order are :class:`hpctrain.torch.reducer.BucketReducer`'s
(the one gradient path, shared with ``hpctrain train``'s parameter servers): parameters cut
into buckets of about ``bucket_mb`` MB in reverse registration order, one flat buffer each,
on the gradients' device, each bucket handed to the communication thread, in bucket order,
as soon as backward has finished its gradients. Here a bucket's operation is an allreduce,
named after the optimizer and the bucket: the communication thread copies the gradients into
the bucket's buffer (torch copies without the GIL, so the copy runs on another core while
backward goes on, as Horovod's fusion-buffer copies run on its C++ thread) and reduces it.
A bucket of one gradient (every parameter larger than the bucket size) is not copied: the
gradient is reduced where it lies, as Horovod reduces a tensor it does not fuse.
``synchronize()`` (called by ``step()``) hands over what is left, with zeros for parameters
that got no gradient, waits, and makes every other ``param.grad`` a view of its place in
the buffer, as DDP's ``gradient_as_bucket_view``: the reduced gradient is there with no
copy back, and with ``zero_grad(set_to_none=False)`` backward accumulates straight into the
buffer, so the next copy is skipped. That trades the copy for a zeroing and an in-place
accumulation, which measured slower on the CPU (docs/training.md): ``hpctrain train`` keeps
``set_to_none=True``. Over one rank (and no compression or predivision) nothing is reduced,
and nothing is copied: an average over one rank is the gradient itself.

On CUDA, the hook records an event on the stream that produced the gradient; the
communication thread waits for it before the reduction (``collectives.allreduce`` then
moves device memory to a CUDA-aware MPI or stages it through pinned host memory itself),
and the caller's stream waits for the reduction's event before the optimizer reads it.
"""

import time
import warnings
import zlib
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .basics import world
from .. import faults
from ..runtime import launcher_rank
from .compression import Compression
from .engine import Signature
from .ops.allreduce import reduce_flat
from .ops.common import Average, Sum, caller_event, dtype_name, member_set, resolve_op, \
    signature, submit, wait_event
from .ops.sparse import sparse_allreduce_async
from .process_sets import global_process_set
from .reducer import BucketReducer

#: Default bucket size (MB), DDP's ``bucket_cap_mb``.
BUCKET_MB = 25.0


@dataclass(frozen=True)
class BucketOperation:
    """A bucket's operation on the engine, what ``submit`` takes: made at the bucket's first
    step and the same at every step after."""

    name: str
    signature: Signature    # what every rank must pass alike
    describe: str           # the call in words, for a mismatch's message
    run: object             # the data phase, run on the communication thread


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods mixed into the user's optimizer class by :func:`DistributedOptimizer`."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, bucket_mb, overlap, process_set, sparse_as_dense):
        super(self.__class__, self).__init__(params)
        self._world = world()
        # A rank outside the process set steps on its own gradients, as in Horovod.
        self._process_set = process_set or global_process_set
        self._member = self._world.rank in (self._process_set.ranks or ())
        if self._member:
            member_set(self._world, self._process_set, "DistributedOptimizer")
        self._sparse_as_dense = bool(sparse_as_dense)
        # Buckets are named after the optimizer: the n-th optimizer made on every rank.
        self._name = self._world.next_name(0, "DistributedOptimizer")
        self._compression = compression
        self._op = op
        self._predivide = float(gradient_predivide_factor)
        self._passes = int(backward_passes_per_step)
        self._should_synchronize = True
        self._synchronized = False
        self.comm_seconds = 0.0
        self._launcher_rank = launcher_rank()     # the fault point's rank, read once
        # Called on the communication thread before each bucket's reduction (fault tests).
        self.before_reduce = None
        named = _name_parameters(self.param_groups, named_parameters)
        # Over one rank an average, sum, min or max changes nothing: no bucket is filled.
        identity = (compression is Compression.none and self._predivide == 1.0)
        skip = not self._member or (self._process_set.size() == 1 and identity)
        self._reducer = BucketReducer(named, int(bucket_mb * 2**20), self._submit,
                                      passes=self._passes, overlap=overlap, skip=skip)
        self._parameter_names = {p: n for n, p in named}     # Horovod's attribute

    # --- during backward ---------------------------------------------------------------------

    def _submit(self, bucket):
        current = world()
        if current is not self._world:
            self._adopt(current)
        if bucket.operation is None:
            bucket.operation = self._operation(bucket)
        op = bucket.operation
        # The same name and signature every step: numbered in the engine's cache after the
        # first, and then announced by a bit instead of in full.
        return submit(self._world, self._process_set, op.name, op.signature, op.describe,
                      op.run, repeats=True)

    def _adopt(self, new):
        """Reduce in ``new``, the world ``hvd.elastic.run`` started again after a lost rank:
        the buckets' operations are made afresh for it (its size, its sets)."""
        self._world = new
        self._member = new.rank in (self._process_set.ranks or ())
        for bucket in self._reducer.buckets:
            bucket.operation = None

    def abandon_step(self):
        """Forget the gradients of this step handed over so far: after a step that failed
        (a rank lost in the middle of backward), the next backward starts a new step.
        ``hvd.elastic``'s ``restore`` calls it."""
        self._reducer.reset()
        self._synchronized = False

    def _operation(self, bucket):
        """``bucket``'s operation, the same every step (made at its first step)."""
        flat = bucket.buffer.flat
        wire = self._compression.compress(flat[:0])[0]
        op, prescale, postscale = self._op, 1.0, 1.0
        if self._op == Average and self._predivide != 1.0:
            op, prescale = Sum, 1.0 / self._predivide
            postscale = self._predivide / self._process_set.size()
        # The parameter names are part of what must match: equal layouts make every rank's
        # bucket collectives match.
        names = zlib.crc32("\n".join(bucket.names).encode())
        # The dtype it travels in (a joined rank's zeros take it), not the buffer's.
        agreed = signature("allreduce", [flat], op, prescale, postscale, (names, self._passes),
                           dtypes=[dtype_name(wire)])
        describe = (f"DistributedOptimizer bucket {bucket.index} ({flat.numel()} elements of "
                    f"{', '.join(bucket.names[:3])}{', ...' if len(bucket.names) > 3 else ''})")
        return BucketOperation(f"{self._name}.bucket.{bucket.index}", agreed, describe,
                               self._reduction(bucket, op, prescale, postscale))

    def _reduction(self, bucket, op, prescale, postscale):
        algo = self._world.algo

        def run(comm, infos):
            if self.before_reduce is not None:
                self.before_reduce()
            wait_event(bucket.event, bucket.params)
            start = time.perf_counter()
            # The copy into the bucket runs here, beside backward, not in the hook: torch
            # copies without the GIL, so it takes the other core while autograd goes on.
            grads = [p.grad for p in bucket.params]
            bucket.sparse = [i for i, g in enumerate(grads) if g is not None and g.is_sparse]
            for i in bucket.sparse:
                # sparse_as_dense: reduced in the bucket like any gradient; otherwise by
                # Horovod's allgather of indices and values, in synchronize().
                grads[i] = grads[i].to_dense() if self._sparse_as_dense else None
            flat = _alone(bucket, grads)
            bucket.in_place = flat is not None
            if flat is None:
                flat = bucket.buffer.pack(grads)
            wire, ctx = self._compression.compress(flat)
            reduce_flat(comm, algo, wire, op, prescale, postscale)
            if wire is not flat:
                flat.copy_(self._compression.decompress(wire, ctx))
            self.comm_seconds += time.perf_counter() - start
            return caller_event(bucket.params[:1])

        return run

    # --- after backward ----------------------------------------------------------------------

    def synchronize(self):
        """Wait until every bucket is reduced; the averaged gradients are in ``param.grad``.

        Synchronisation point: every bucket's collective. Parameters that got no gradient
        in this step take part with zeros (and then hold the others' average).
        """
        if self._reducer.skip:
            self._reducer.reset()   # one rank's average is its own gradient: nothing to do
            self._synchronized = True
            return
        events = self._reducer.synchronize()
        sparse = []
        for bucket, event in zip(self._reducer.buckets, events):
            if event is not None:
                torch.cuda.current_stream(event.device).wait_event(event)
            if bucket.in_place:
                continue    # the one gradient was reduced where it lies
            for i, (p, slot) in enumerate(zip(bucket.params, bucket.buffer.slots)):
                if i not in bucket.sparse:
                    p.grad = slot   # the reduced gradient, in place: no copy back
            sparse.extend((bucket, i) for i in bucket.sparse)
        self._reduce_sparse(sparse)
        self._synchronized = True

    def _reduce_sparse(self, places):
        """The sparse gradients of this step: reduced as sparse tensors (an allgather of
        indices and values) unless ``sparse_as_dense``, when their dense reduction is in the
        bucket already; either way ``param.grad`` is sparse again, as the optimizer expects
        (``SparseAdam``)."""
        handles = []
        for bucket, i in places:
            p = bucket.params[i]
            if self._sparse_as_dense:
                p.grad = bucket.buffer.slots[i].to_sparse()
            else:
                handles.append((p, sparse_allreduce_async(
                    p.grad, f"{self._name}.sparse.{bucket.names[i]}", self._op,
                    self._process_set)))
        for p, handle in handles:
            p.grad = handle()

    @contextmanager
    def skip_synchronize(self):
        """Within this block ``step()`` does not synchronize (after an explicit one)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Synchronize (unless inside ``skip_synchronize``), then the wrapped step."""
        faults.inject("torch.step", self._launcher_rank)
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "after optimizer.synchronize(), and without a loss.backward() "
                              "in between: use `with optimizer.skip_synchronize()` around "
                              "step()", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none=True):
        """Clear gradients; an error between ``backward`` and ``step`` (a race otherwise)."""
        if self._reducer.in_step:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)

    @property
    def buckets(self):
        """The gradient buckets, in the order they are reduced."""
        return self._reducer.buckets

    def close(self, wait=True):
        """Remove the hooks (the optimizer then steps without reducing)."""
        self._reducer.close()


def _alone(bucket, grads):
    """The flat view of a bucket's one gradient, to be reduced where it lies; ``None`` when
    the bucket holds several (or its gradient is missing, sparse, strided, or of another
    dtype or device than the buffer): those are copied into the buffer.

    Horovod reduces a tensor it does not fuse in its own memory too. A parameter larger
    than the bucket size is alone in its bucket, so the largest gradients, most of the
    bytes of a step, are never copied."""
    if len(grads) != 1 or bucket.sparse:
        return None
    grad, flat = grads[0], bucket.buffer.flat
    if grad is None or not grad.is_contiguous() or grad.dtype != flat.dtype \
            or grad.device != flat.device:
        return None
    return grad.view(-1)


def _name_parameters(param_groups, named_parameters):
    """``[(name, param)]`` in the optimizer's order; Horovod's checks on the names."""
    params = [p for group in param_groups for p in group["params"]]
    if named_parameters is None:
        return [(f"allreduce.noname.{i}", p) for i, p in enumerate(params)]
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    names = [n for n, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found "
                         f"duplicates: {', '.join(duplicates)}")
    by_param = {p: n for n, p in named}
    unnamed = [id(p) for p in params if p not in by_param]
    if unnamed:
        raise ValueError(f"named_parameters was specified, but one or more model parameters "
                         f"were not named. Python object ids: {unnamed}")
    return [(by_param[p], p) for p in params]


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set,
                         bucket_mb=None, overlap=True):
    """Wrap ``optimizer`` so that ``step()`` uses gradients averaged over all ranks.

    The result is an instance of the optimizer's own class (``isinstance`` and
    ``state_dict`` work as before) with ``synchronize()``, ``skip_synchronize()`` and
    ``zero_grad()`` as in Horovod. ``bucket_mb`` (hpctrain's): the bucket size (default
    ``HOROVOD_FUSION_THRESHOLD`` bytes if that is set, else :data:`BUCKET_MB`);
    ``overlap=False`` reduces every bucket in ``synchronize()`` instead of during backward.
    Every rank must build the same model (checked at the first step, on every rank).
    """
    w = world()
    if bucket_mb is None:
        fusion = w.settings.fusion_bytes
        bucket_mb = BUCKET_MB if fusion is None else fusion / 2**20
    op = resolve_op(None, op)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got "
                         f"{backward_passes_per_step}")
    del num_groups, groups     # fusion is by bucket size here
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    wrapped = cls(optimizer.param_groups, named_parameters, compression,
                  backward_passes_per_step, op, gradient_predivide_factor, bucket_mb, overlap,
                  process_set, sparse_as_dense)
    wrapped.state = optimizer.state       # keep any state the optimizer already has
    return wrapped


__all__ = ["DistributedOptimizer", "BUCKET_MB"]
