"""``--regime async-server``: an asynchronous parameter server over point-to-point messages.

Rank 0 is the server and trains nothing; ranks 1 … N-1 are workers with their own shares of
the data (the sampler runs over N-1 workers). A worker loops without any global barrier:

  push: send the version its weights came from, then its gradient, to the server;
  pull: receive the server's new version and weights, and continue with them.

The server answers pushes in the order they arrive (``ANY_SOURCE``): it applies each
gradient at once with its optimizer, bumps the version and sends the weights back to that
worker only. A gradient's *staleness* is the server's version when it is applied minus the
version the worker computed it on: the number of other workers' updates it missed.

Epochs stay aligned: each worker ends its epoch with a "done" message; after all workers are
done, rank 0 broadcasts its weights (the one collective per epoch), and every rank
evaluates the same model. Messages between a pair of ranks with one tag never overtake
each other, which is what keeps a worker's version and gradient together.
"""

import dataclasses
import time

import torch
from mpi4py import MPI

from .. import faults, tags
from ..torch.buckets import FlatBuffer
from .nonfinite import NonFiniteError, verdict
from .regimes import Regime
from .replicas import broadcast_model, start_from_root

SERVER = 0
TAG_PUSH, TAG_GRAD = tags.ASYNC_SERVER_PUSH, tags.ASYNC_SERVER_GRAD
TAG_VERSION, TAG_WEIGHTS = tags.ASYNC_SERVER_VERSION, tags.ASYNC_SERVER_WEIGHTS


class AsyncServerRegime(Regime):
    """The server's optimizer and the message loop of both sides.

    ``comm_seconds`` stays NaN: the workers' push/pull times are added up per epoch.
    """

    def __init__(self, model, make_optimizer, comm, *, bucket_mb=None, overlap=None):
        # bucket_mb, overlap: the synchronous regimes' options, taken alike; not used here
        # (a worker pushes its whole gradient at once, on the main thread).
        self.model, self.comm = model, comm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.params)
        # Messages travel through host memory (send/recv of NumPy views).
        self.buffer = FlatBuffer(self.params, device=torch.device("cpu"))
        self.flat = self.buffer.flat

    def broadcast_initial(self):
        """Collective: every rank takes the server's weights and optimizer state."""
        start_from_root(self.model, self.optimizer, self.comm, SERVER)

    def train_epoch(self, run, sums, progress):
        """Serve (rank 0) or work (others) until every worker has finished the epoch; add
        the epoch's measurements to ``sums``; return where the run stands then: a copy of
        ``run.position`` that this regime advanced (the server's updates, then the same on
        every rank, and the updates this rank skipped).

        Synchronisation point at the end: the server's weights and step count go to all.
        """
        position = dataclasses.replace(run.position)
        if self.comm.Get_rank() == SERVER:
            self._serve(run, sums, progress, position)
        else:
            self._work(run, sums, position)
        broadcast_model(self.model, self.comm, SERVER)
        position.step = self.comm.bcast(position.step, root=SERVER)
        return position

    def _serve(self, run, sums, progress, position):
        active, status = self.comm.Get_size() - 1, MPI.Status()
        while active:
            version = self.comm.recv(source=MPI.ANY_SOURCE, tag=TAG_PUSH, status=status)
            worker = status.Get_source()
            if version is None:  # that worker's epoch is over
                active -= 1
                continue
            self.comm.Recv(self.flat.numpy(), source=worker, tag=TAG_GRAD)
            faults.inject("train.serve", SERVER)   # that worker now waits for the reply
            stop = position.reached_max_steps()
            staleness = position.step - version
            if not stop:
                self._apply(run.schedule(position.step), sums, staleness)
                position.step += 1
            self.buffer.pack(self.params)
            self.comm.send((position.step, stop), dest=worker, tag=TAG_VERSION)
            self.comm.Send(self.flat.numpy(), dest=worker, tag=TAG_WEIGHTS)
            progress.update(position.step - sums.first_step, f"staleness {staleness}")

    def _apply(self, lr, sums, staleness):
        start = time.perf_counter()
        for p, slot in zip(self.params, self.buffer.slots):
            p.grad = slot.to(p.device, copy=True)   # the buffer receives the next message
        self.set_lr(lr)
        self.optimizer.step()
        sums.updates += 1
        sums.staleness += staleness
        sums.staleness_max = max(sums.staleness_max, staleness)
        sums.server_s += time.perf_counter() - start

    def _work(self, run, sums, position):
        version = position.step
        sampler = run.data.sampler
        for positions in sampler:
            start = time.perf_counter()
            x, y = run.read_batch(positions)
            loaded = time.perf_counter()
            loss, correct, count = run.forward_backward(x, y)
            computed = time.perf_counter()
            if verdict(loss, self.gradients()):
                # Only this worker's gradient is affected and no collective is pending: it
                # alone decides (an error ends the job through the launcher's abort).
                if run.config.nonfinite == "error":
                    raise NonFiniteError(f"non-finite loss or gradients on worker rank "
                                         f"{run.rank} at its batch {sampler.batch}: "
                                         f"stopping (--nonfinite error); --nonfinite skip "
                                         f"skips such updates instead")
                position.skipped += 1
                continue
            run.count_batch(sums, loss, correct, count)
            self.buffer.pack([p.grad for p in self.params])
            faults.inject("train.push", run.rank)
            self.comm.send(version, dest=SERVER, tag=TAG_PUSH)
            self.comm.Send(self.flat.numpy(), dest=SERVER, tag=TAG_GRAD)
            version, stop = self.comm.recv(source=SERVER, tag=TAG_VERSION)
            self.comm.Recv(self.flat.numpy(), source=SERVER, tag=TAG_WEIGHTS)
            self.buffer.unpack(self.params)
            done = time.perf_counter()
            sums.data_s += loaded - start
            sums.compute_s += computed - loaded
            sums.exposed_s += done - computed
            sums.comm_s += done - computed
            if stop:
                break
        self.comm.send(None, dest=SERVER, tag=TAG_PUSH)
