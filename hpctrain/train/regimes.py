"""The synchronous training regimes: how gradients become the same update on every rank.

Each regime wraps the model and its optimizer and offers the same small interface, which the
training loop drives once per step after ``loss.backward()``:

- ``broadcast_initial()``: collective; every rank gets rank 0's weights and optimizer state;
- ``set_lr(lr)``; ``step(may_update)``: collective; finish the gradient exchange, call
  ``may_update()`` (a collective: every rank must get the same answer), and unless it
  returns False update the weights on every rank; return what happened, a
  :class:`StepResult` (the seconds spent waiting for communication after backward, and
  whether the update happened);
- ``gradients()``: the gradient tensors this rank holds after the exchange (for the check
  for NaN and Inf);
- ``comm_seconds``: total communication time so far (NaN where the library hides it);
- ``optimizer_state()`` / ``load_optimizer_state(state)``: for checkpoints
  (``optimizer_state`` is collective: the sharded regime gathers its shards on rank 0);
- ``close()``.

Regimes:

- ``AllreduceRegime``: ``hpctrain.torch.DistributedOptimizer`` averages gradients in
  overlapped buckets with ``--allreduce``'s algorithm (Horovod's own optimizer for
  ``horovod``), then the same optimizer step on every rank (``--regime allreduce``);
- ``ServerRegime``: a synchronous parameter server on rank 0: gradients are summed onto it
  (``Reduce``, bucket by bucket, overlapped), it alone steps, then broadcasts the weights;
- ``ShardedServerRegime``: every rank serves one shard of every bucket: ``Reduce_scatter``
  of the gradients, a step of the shard's optimizer (its state lives only there, as in
  ZeRO stage 1), then ``Allgatherv`` of the updated weights.

All three compute the same update as one process training on the global batch, and all
three take their gradients through the same buckets, hpctrain.torch's
:class:`~hpctrain.torch.reducer.BucketReducer`: an allreduce each, negotiated by name on
hpctrain.torch's engine, for the first; a ``Reduce`` or a ``Reduce_scatter`` each, run in
bucket order on a thread of their own, for the servers.
"""

import math
import os
import time
import zlib
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .. import faults
from ..collectives.dtypes import NUMPY_DTYPES, mpi_datatype
from ..runtime import agree_with_root
from ..sampler import shard_indices
from .replicas import start_from_root


@dataclass(frozen=True)
class StepResult:
    """What one ``Regime.step`` did, the same on every rank."""

    waited: float         # seconds spent waiting for communication after backward
    updated: bool = True  # False: ``may_update()`` said no, the update was skipped


class Regime:
    """What every regime shares: one local optimizer in ``self.optimizer``."""

    optimizer = None
    comm_seconds = math.nan

    def set_lr(self, lr):
        """Use ``lr`` from the next update on."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def optimizer_state(self):
        """The optimizer's state, for a checkpoint (the same on every rank that steps)."""
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state):
        """Continue from a saved optimizer state."""
        self.optimizer.load_state_dict(state)

    def gradients(self):
        """The gradients this rank holds after ``step``'s exchange: every ``param.grad``."""
        return [p.grad for p in self.model.parameters() if p.grad is not None]

    def close(self):
        """Release what the regime holds (nothing by default)."""

    def abandon(self):
        """After a failure: release what needs no other rank (nothing by default)."""


class AllreduceRegime(Regime):
    """Average gradients with :class:`hpctrain.torch.DistributedOptimizer` (any algorithm).

    The same gradient path as any user script: ``hpctrain.torch`` is started over the run's
    ranks with ``allreduce=algo`` (``horovod`` hands the optimizer to the real Horovod).
    Parameters and optimizer state come from rank 0 as in every regime
    (:func:`~hpctrain.train.replicas.start_from_root`). ``comm_seconds`` is NaN under
    Horovod, which hides it.
    """

    def __init__(self, model, make_optimizer, comm, *, algo, bucket_mb, overlap):
        from .. import torch as hvd

        self.model, self.comm, self.hvd = model, comm, hvd
        self.started = not hvd.is_initialized()
        if self.started:
            if algo == "horovod":
                # Only effective at the process's first Horovod start.
                os.environ.setdefault("HOROVOD_FUSION_THRESHOLD", str(int(bucket_mb * 2**20)))
            hvd.init(comm=comm, allreduce=algo)
        elif (hvd.algorithm(), hvd.size()) != (algo, comm.Get_size()):
            raise RuntimeError(f"hpctrain.torch was started with allreduce "
                               f"{hvd.algorithm()!r} on {hvd.size()} ranks; this run wants "
                               f"{algo!r} on {comm.Get_size()}")
        self.optimizer = None
        try:
            self.optimizer = hvd.DistributedOptimizer(
                make_optimizer(model.parameters()), named_parameters=model.named_parameters(),
                bucket_mb=bucket_mb, overlap=overlap)
        except BaseException:
            self.abandon()
            raise
        if hasattr(self.optimizer, "before_reduce"):     # not Horovod's
            rank = comm.Get_rank()
            self.optimizer.before_reduce = lambda: faults.inject("train.reduce", rank)
        self.overlap = overlap

    @property
    def buckets(self):
        """The gradient buckets (``None`` under Horovod, which fuses by its own rules)."""
        return getattr(self.optimizer, "buckets", None)

    @property
    def comm_seconds(self):
        """Seconds the communication thread spent reducing gradients."""
        return getattr(self.optimizer, "comm_seconds", math.nan)

    def broadcast_initial(self):
        """Collective: every rank takes rank 0's weights and optimizer state."""
        # Over the run's ranks, as every regime does, not through hpctrain.torch's engine
        # (or Horovod): nothing is being reduced yet, so no negotiation is needed.
        start_from_root(self.model, self.optimizer, self.comm)

    def step(self, may_update=bool):
        """Collective: wait for the averaged gradients, then step; a :class:`StepResult`."""
        start = time.perf_counter()
        self.optimizer.synchronize()
        waited = time.perf_counter() - start
        if not may_update():
            self._forget_step()
            return StepResult(waited, updated=False)
        with self.optimizer.skip_synchronize():
            self.optimizer.step()
        return StepResult(waited)

    def _forget_step(self):
        # The gradients were averaged but no step follows: hpctrain.torch's optimizer is
        # told, as its step() would have told it, or it takes its next step() for this one.
        # Horovod's has no public way to be told and needs none here: it looks only in a
        # step() outside skip_synchronize(), which this regime never takes.
        abandon_step = getattr(self.optimizer, "abandon_step", None)    # not Horovod's
        if abandon_step is not None:
            abandon_step()

    def close(self):
        """Remove the optimizer's hooks; stop hpctrain.torch if this regime started it."""
        close = getattr(self.optimizer, "close", None)
        if close is not None:
            close()
        if self.started:
            self.hvd.shutdown()

    def abandon(self):
        """After a failure: remove the hooks and forget the world, waiting for no rank."""
        close = getattr(self.optimizer, "close", None)
        if close is not None:
            close()
        if self.started:
            from ..torch import basics

            basics.abandon()


def check_same_buckets(buckets, comm):
    """Collective: the same ``Verdict`` on every rank unless all ranks cut rank 0's buckets.

    Equal layouts are what makes every rank's bucket collectives match; a rank with another
    model (another --hidden, another data file's shapes, a different code version) would
    otherwise hang or mix data.
    """
    layout = [(b.flat.numel(), str(b.flat.dtype), zlib.crc32("\n".join(b.names).encode()))
              for b in buckets]
    agree_with_root(comm, layout, lambda root: (
        f"gradient buckets other than rank 0's ({len(root)} buckets): do all ranks build the "
        f"same model?"))


class _BucketRegime(Regime):
    """Gradients handed over bucket by bucket to ``_reduce`` (a parameter server's
    collective), through hpctrain.torch's :class:`~hpctrain.torch.reducer.BucketReducer`.

    The servers' buckets need no negotiation: every rank cuts the same buckets (checked
    here, once) and the reducer hands them over in bucket order, so one thread that runs
    them in that order (:class:`~hpctrain.torch.reducer.InOrder`) on a communicator of its
    own makes every rank's collectives match. Measured, it exposes less communication than
    the negotiating engine of ``hpctrain.torch`` (docs/training.md).
    """

    def __init__(self, model, make_optimizer, comm, *, bucket_mb, overlap):
        from ..torch.reducer import BucketReducer, InOrder

        self.model, self.comm = model, comm
        self.optimizer = make_optimizer(model.parameters())
        self.reduce_seconds = 0.0
        self.extra_seconds = 0.0
        # The thread's collectives run on a communicator of their own, so that they can
        # never be matched with the main thread's on ``comm``.
        self.grad_comm = comm.Dup()
        self._in_order = InOrder("hpctrain-grad-comm")
        # Buffers in host memory: the servers' collectives take NumPy views. Registration
        # order is the same on every rank (the same code builds the model), so the buckets
        # are too; do not sort by name: it would break the reverse order in which backward
        # produces gradients.
        self.reducer = BucketReducer(model.named_parameters(), int(bucket_mb * 2**20),
                                     self._submit, overlap=overlap,
                                     device=torch.device("cpu"))
        self.overlap = overlap
        check_same_buckets(self.reducer.buckets, comm)

    @property
    def buckets(self):
        """The gradient buckets."""
        return self.reducer.buckets

    @property
    def comm_seconds(self):
        """Seconds spent reducing gradients and sending weights."""
        return self.reduce_seconds + self.extra_seconds

    def _submit(self, bucket):
        return self._in_order.submit(lambda: self._reduce_bucket(bucket))

    def _reduce_bucket(self, bucket):
        from ..torch.ops.common import wait_event

        faults.inject("train.reduce", self.grad_comm.Get_rank())
        wait_event(bucket.event, bucket.params)
        start = time.perf_counter()
        bucket.buffer.pack(bucket.gradients())
        self._reduce(self.grad_comm, bucket)
        self.reduce_seconds += time.perf_counter() - start

    def _gather_gradients(self):
        """Collective: every bucket's reduction; the buckets' values into ``param.grad``
        (the server's average on the server); return the seconds waited."""
        start = time.perf_counter()
        self.reducer.synchronize()
        waited = time.perf_counter() - start
        for bucket in self.reducer.buckets:
            for p in bucket.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            bucket.buffer.unpack(bucket.gradients())
        return waited

    def broadcast_initial(self):
        """Collective: every rank takes rank 0's weights and optimizer state."""
        start_from_root(self.model, self.optimizer, self.comm)

    def close(self):
        """Remove the hooks, stop the thread, free the communicator."""
        self.reducer.close()
        self._in_order.close()
        self.grad_comm.Free()

    def abandon(self):
        """After a failure: the thread may be stuck in a collective; do not wait for it."""
        self.reducer.close()
        self._in_order.close(wait=False)


class ServerRegime(_BucketRegime):
    """A synchronous parameter server on rank 0 (``--regime server``).

    Every rank, rank 0 included, computes gradients on its share of the global batch; they
    are summed onto rank 0 bucket by bucket while backward runs; rank 0 averages them, takes
    the optimizer step and broadcasts the new weights. Only rank 0's optimizer has state.
    """

    root = 0

    def _reduce(self, comm, bucket):
        from mpi4py import MPI

        flat = bucket.flat
        buf = flat.numpy()
        if comm.Get_rank() == self.root:
            comm.Reduce(MPI.IN_PLACE, buf, op=MPI.SUM, root=self.root)
            flat /= comm.Get_size()
        else:
            comm.Reduce(buf, None, op=MPI.SUM, root=self.root)

    def step(self, may_update=bool):
        """Collective: gradients onto rank 0, its step, its weights to all; a
        :class:`StepResult`."""
        waited = self._gather_gradients()
        if not may_update():
            return StepResult(waited, updated=False)
        if self.comm.Get_rank() == self.root:
            self.optimizer.step()
        start = time.perf_counter()
        for bucket in self.reducer.buckets:
            _broadcast_bucket_weights(bucket, self.comm, self.root)
        spent = time.perf_counter() - start
        self.extra_seconds += spent
        return StepResult(waited + spent)


def _broadcast_bucket_weights(bucket, comm, root):
    # The bucket's gradient buffer is free after wait(): re-use it to send the weights.
    if comm.Get_rank() == root:
        bucket.buffer.pack(bucket.params)
    comm.Bcast(bucket.flat.numpy(), root=root)
    if comm.Get_rank() != root:
        bucket.buffer.unpack(bucket.params)


class ShardedServerRegime(_BucketRegime):
    """Every rank serves a shard of every bucket (``--regime sharded-server``).

    Bucket b's flat vector is cut into ``size`` contiguous shards; rank r owns shard r: it
    receives the summed gradient of that shard (``Reduce_scatter``), steps an optimizer that
    holds only that shard's weights and state, and the updated shards are gathered on every
    rank (``Allgatherv``). Optimizer state is therefore split across ranks; checkpoints
    gather it on rank 0 and a resume needs the same number of ranks.
    """

    def __init__(self, model, make_optimizer, comm, *, bucket_mb, overlap):
        self._make_optimizer = make_optimizer
        super().__init__(model, lambda params: None, comm, bucket_mb=bucket_mb,
                         overlap=overlap)
        rank, size = comm.Get_rank(), comm.Get_size()
        self.layout = []  # per bucket: (counts, displacements, my slice)
        for bucket in self.reducer.buckets:
            counts = np.array([len(shard_indices(bucket.flat.numel(), r, size))
                               for r in range(size)])
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            self.layout.append((counts, displs, slice(displs[rank], displs[rank] + counts[rank])))
        # In the bucket's dtype: Reduce_scatter receives into them from the bucket.
        self.shard_grads = [torch.zeros(int(c[rank]), dtype=b.flat.dtype)
                            for b, (c, _, _) in zip(self.reducer.buckets, self.layout)]
        self.shards, self._pending_state = None, None

    def _reduce(self, comm, bucket):
        from mpi4py import MPI

        counts = self.layout[bucket.index][0]
        grad = self.shard_grads[bucket.index]
        comm.Reduce_scatter(bucket.flat.numpy(), grad.numpy(), recvcounts=counts, op=MPI.SUM)
        grad /= comm.Get_size()

    def broadcast_initial(self):
        """Collective: rank 0's weights to all; each shard takes rank 0's shard state."""
        start_from_root(self.model, None, self.comm)
        self.shards = [nn.Parameter(self._flat_weights(b)[mine].clone())
                       for b, (_, _, mine) in zip(self.reducer.buckets, self.layout)]
        self.optimizer = self._make_optimizer(self.shards)
        state = self._pending_state
        shards = state["shards"] if state and self.comm.Get_rank() == 0 else None
        mine = self.comm.scatter(shards, root=0)
        if mine is not None:
            self.optimizer.load_state_dict(mine)
        self._pending_state = None

    @staticmethod
    def _flat_weights(bucket):
        return bucket.buffer.pack(bucket.params).clone()

    def step(self, may_update=bool):
        """Collective: reduce-scatter, step the own shards, all-gather; a
        :class:`StepResult`."""
        waited = self._gather_gradients()
        for shard, grad in zip(self.shards, self.shard_grads):
            shard.grad = grad
        if not may_update():
            return StepResult(waited, updated=False)
        self.optimizer.step()
        start = time.perf_counter()
        for bucket, shard, (counts, displs, _) in zip(self.reducer.buckets, self.shards,
                                                      self.layout):
            flat = bucket.flat.numpy()
            self.comm.Allgatherv(shard.detach().numpy(),
                                 [flat, counts, displs, mpi_datatype(NUMPY_DTYPES[flat.dtype])])
            bucket.buffer.unpack(bucket.params)
        spent = time.perf_counter() - start
        self.extra_seconds += spent
        return StepResult(waited + spent)

    def gradients(self):
        """This rank's own gradients and the averaged gradient of the shards it serves."""
        return super().gradients() + self.shard_grads

    def optimizer_state(self):
        """Collective: every shard's optimizer state, gathered on rank 0 (None elsewhere)."""
        shards = self.comm.gather(self.optimizer.state_dict(), root=0)
        if shards is None:
            return None
        return {"sharded": True, "world_size": self.comm.Get_size(), "shards": shards}

    def load_optimizer_state(self, state):
        """Keep a saved sharded state; ``broadcast_initial`` hands each rank its shard."""
        if not state.get("sharded") or state["world_size"] != self.comm.Get_size():
            raise ValueError("this checkpoint's optimizer state was not written by "
                             f"--regime sharded-server on {self.comm.Get_size()} ranks")
        self._pending_state = state
