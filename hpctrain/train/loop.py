"""The training loop: ``train(config, comm) -> TrainResult``, callable in-process.

``train`` is a collective over ``comm``: every rank calls it with the same configuration.
Start-up runs in an order that keeps bad input from hanging a job:

1. local checks on every rank, no communication: the world size against the regime, the
   checkpoint to resume (its checksum; ``--resume auto`` falls back to an older intact
   one), the data file and its datasets, the sampler, the model. They end in the first
   collective, one allgather of every rank's problems (``hpctrain.runtime.checks``): bad
   input found by any rank raises the same ``Verdict`` on every rank;
2. the next collectives: the digits file is prepared by rank 0 if missing (barrier, then
   the checks that need its rows, agreed the same way), ``comm`` is duplicated, the stall
   watchdog starts, the node-local rank picks the GPU;
3. rank 0's weights and optimizer state are broadcast, and a checksum proves that every
   rank holds the same weights.

Each step: read this rank's rows, forward, backward (the regime's hooks start reducing
gradient buckets meanwhile), ``regime.step()`` (wait for the reductions; one small
collective in which every rank says whether its loss and gradients are finite, so that all
of them stop, or skip the update, together; update). Every ``check_consistency`` steps the
ranks compare a hash of their weights. Each epoch: validation on disjoint shards, metrics
summed over ranks, one line and one CSV row on rank 0, and a checkpoint when due.

Before each step and each group of epoch-end collectives every rank tells the stall
watchdog (``hpctrain.watchdog``), which names on rank 0 the ranks that a collective has
waited for longer than ``stall_warning`` seconds and aborts the job after ``stall_timeout``.
"""

import dataclasses
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .. import elastic as job
from .. import faults
from ..data import HDF5Dataset, digits, split_indices
from ..data.torch_dataset import TorchDataset
from ..errors import UsageError, Verdict
from ..runtime import checks
from ..sampler import shard_indices
from ..torch.engine import ProcessFailure, process_failure
from ..watchdog import StallWatchdog
from . import build, checkpoint, header, replicas, report, resume
from .config import checkpoint_interval
from .nonfinite import NonFiniteError, describe, verdict
from .schedule import WarmupSchedule, target_lr


@dataclass
class TrainResult:
    """What a finished run leaves on every rank."""

    state: dict       # final model state (CPU copies), identical on every rank
    history: list     # one dict per epoch: the rows of metrics.csv
    step: int         # optimizer steps (server updates for async-ps) in all
    checksum: int     # fingerprint of the final weights, checked equal on every rank
    run_path: Path
    skipped: int = 0  # updates skipped for a NaN or Inf (--nonfinite skip)


@dataclass
class EpochSums:
    """Running sums of one epoch on one rank; summed over ranks at the end of the epoch."""

    first_step: int = 0
    loss: float = 0.0          # sum of per-sample losses
    correct: float = 0.0
    samples: float = 0.0
    data_s: float = 0.0
    compute_s: float = 0.0
    exposed_s: float = 0.0
    comm_s: float = 0.0
    wall_s: float = 0.0
    updates: float = 0.0       # async-ps: updates the server applied
    staleness: float = 0.0     # async-ps: sum of the applied gradients' staleness
    staleness_max: float = 0.0
    server_s: float = 0.0


def train(config, comm=None):
    """Train as ``config`` says, over ``comm`` (default ``COMM_WORLD``); return the result.

    Collective: every rank of ``comm`` must call it with the same configuration.

    ``--elastic``: the commit is the checkpoint (``--checkpoint-every``, in steps for a
    small loss). A run that loses a rank goes on from the last one, as ``--resume auto``
    would, on the ranks that are left. On an MPI with fault tolerance that happens here, in
    place: the survivors revoke every communicator of the run (:meth:`Run.abandon`), shrink
    the world (:func:`hpctrain.elastic.survivors`) and start the run again on it. On any
    other MPI the job ends, and ``python -m hpctrain.launch --elastic`` starts it again on
    the hosts that are left, where it resumes the same way. The rest of an epoch is split
    over the new number of ranks (the sampler counts the samples done), and the learning
    rate is scaled to the new global batch.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    if config.elastic:
        config = dataclasses.replace(config, resume=config.resume or "auto")
    for _ in range(comm.Get_size()):        # each failure takes at least one rank
        try:
            return train_once(config, comm)
        except BaseException as exc:
            if not (config.elastic and lost_rank(exc)):
                raise
        comm = job.survivors(comm)
        # Whatever checkpoint the first attempt resumed, the next one goes on from the
        # newest in the run directory: the last commit.
        config = dataclasses.replace(config, resume="auto")
    raise AssertionError("not reached: a rank is always left, or the job has ended")


def train_once(config, comm):
    """:func:`train` without ``--elastic``: one attempt over ``comm``."""
    run = Run(config, comm)
    try:
        result = run.fit()
    except BaseException as exc:
        run.abandon(lost_rank(exc))
        raise
    run.close()
    return result


class Run:
    """One training run: its data, model, regime, position and output."""

    def __init__(self, config, comm):
        torch.set_num_threads(config.threads)
        self.config, self.rank, self.size = config, comm.Get_rank(), comm.Get_size()
        self.asynchronous = config.regime == "async-ps"
        self.trainers = self.size - 1 if self.asynchronous else self.size
        auto = not config.dataset and digits.is_auto_prepared(config.data)
        # The first collective: every rank's verdict on its own checks, agreed in one
        # allgather, so that bad input ends every rank the same way (a Verdict), whichever
        # rank found it and even when only some did (a file missing on one node).
        with checks(comm):
            self._check_inputs(config, open_data=not auto)
        if auto:
            # Every rank decides the same way, from the configuration alone: rank 0 writes
            # the digits (barrier), then the checks that need the rows run on the file.
            self.prepared = digits.ensure(config.data, comm)
            with checks(comm):
                self.dataset = HDF5Dataset(config.data, config.x, config.y)
                self._build_from_data(config)
        else:
            self.prepared = False
        self.comm = comm.Dup()
        try:
            self._start(config, comm)
        except BaseException as exc:
            self.abandon(lost_rank(exc))
            raise

    def _check_inputs(self, config, open_data):
        """Local checks and builds, no communication: the world size against the regime, the
        checkpoint to resume (its checksum; ``--resume auto`` falls back to an older intact
        one) and its settings, and with ``open_data`` the data and what is built from it.
        Bad input raises ``UsageError``."""
        build.check_world(config, self.size)
        self.resume_path, self.saved = checkpoint.find(config.resume, config.run_path,
                                                       log=self._log)
        if self.saved is not None:
            resume.check_checkpoint(self.saved, config, self.size, self.resume_path)
        if config.dataset:
            self.dataset = TorchDataset(config.dataset)
        elif open_data:
            self.dataset = HDF5Dataset(config.data, config.x, config.y)
        if open_data:
            self._build_from_data(config)

    def _build_from_data(self, config):
        """The split, the sampler and the model, each checked against the data (local)."""
        self.train_rows, self.val_rows = split_indices(len(self.dataset), config.val_fraction,
                                                       config.split_seed)
        self.sampler = build.make_sampler(config, len(self.train_rows), self.rank, self.size)
        random.seed(config.seed)
        np.random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.model = build.make_model(config, self.dataset)
        self.input_dtype = _input_dtype(self.model)

    def _start(self, config, comm):
        # The collective part of start-up: a failure here must stop the watchdog's thread.
        self.watchdog = StallWatchdog(self.comm, config.stall_warning,
                                      config.stall_timeout or None)
        self.device = build.device(config, self.comm)
        self.model.to(self.device)
        self.regime = build.make_regime(config, self.model, self.comm, comm)
        update_batch = config.batch_size * (1 if self.asynchronous else self.size)
        self.updates_per_epoch = len(self.sampler) * (self.trainers if self.asynchronous else 1)
        self.lr = target_lr(config.lr, update_batch, config.base_batch_size, config.lr_scaling)
        self.warmup_steps = round(config.warmup_epochs * self.updates_per_epoch)
        # The schedule spans all epochs; max_steps only stops early and changes no step's lr,
        # so that a run stopped and resumed follows the uninterrupted run exactly.
        total = config.epochs * self.updates_per_epoch
        self.schedule = WarmupSchedule(config.lr, self.lr, self.warmup_steps, total,
                                       config.lr_decay)
        self.step, self.sums, self.history, self.skipped = 0, EpochSums(), [], 0
        self.every = checkpoint_interval(config.checkpoint_every)
        if self.saved is not None:
            with checks(self.comm):   # every rank loads the same file: they agree on it
                self._restore(self.saved)
        self.start_step = self.step
        self._check_same_start()
        faults.inject("train.start", self.rank)
        self.watchdog.arrive("start-up broadcast")
        self.regime.broadcast_initial()
        self.initial_checksum = replicas.check_identical(self.model, self.comm,
                                                         "after the initial broadcast")
        self.progress = report.Progress(0, "", False)
        # A resumed run drops the rows written after its checkpoint: they are trained again.
        self.metrics = report.MetricsFile(config.run_path / "metrics.csv",
                                          append=self.saved is not None, enabled=self.rank == 0,
                                          epochs_done=self.sampler.epoch)
        if self.rank == 0:
            header.write(self)

    # --- start-up ---------------------------------------------------------------------------

    def _log(self, text):
        if self.rank == 0:
            print(text, file=sys.stderr, flush=True)

    def _restore(self, saved):
        try:
            self.model.load_state_dict(saved["model"])
            self.regime.load_optimizer_state(saved["optimizer"])
            saved_trainers = saved["world_size"] - (1 if self.asynchronous else 0)
            self.sampler.load_state_dict(saved["sampler"], size=saved_trainers)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise UsageError(f"checkpoint {str(self.resume_path)!r} does not fit this run: "
                             f"{exc}") from None
        self.step = saved["step"]
        self.sums = EpochSums(**saved["epoch_sums"])
        checkpoint.set_rng_state(saved["rng"])

    def _check_same_start(self):
        """Collective: every rank starts at the same position (one allgather).

        Ranks that found different checkpoints (``--resume auto`` with a run directory that
        is not on a shared file system) would run different numbers of steps and hang in a
        collective; they fail together here instead.
        """
        start = (str(self.resume_path), self.sampler.state_dict(), self.step)
        starts = self.comm.allgather(start)
        differ = [r for r, other in enumerate(starts) if other != starts[0]]
        if differ:
            raise Verdict.everywhere(f"ranks {differ} start elsewhere than rank 0 ({starts[0]})"
                                     f": is the run directory on a file system all ranks "
                                     f"share?", self.comm)

    # --- training ----------------------------------------------------------------------------

    def fit(self):
        """Train epoch after epoch until ``epochs`` or ``max_steps``; return the result."""
        while self.sampler.epoch < self.config.epochs:
            label = f"epoch {self.sampler.epoch + 1}/{self.config.epochs}"
            total = self.updates_per_epoch
            self.progress = report.Progress(total, label, report.progress_enabled(
                self.config.progress, self.rank))
            if self.sampler.batch == 0:
                self.sums = EpochSums(first_step=self.step)
            started = time.perf_counter()
            if self.asynchronous:
                self.regime.train_epoch(self, self.sums)
            else:
                self._train_epoch()
            self.sums.wall_s += time.perf_counter() - started
            self.progress.close()
            self._end_epoch()
            if self.reached_max_steps():
                break
            self.sampler.set_epoch(self.sampler.epoch + 1)
        self.watchdog.arrive("final weight check")
        final = replicas.check_identical(self.model, self.comm, "at the end of training")
        state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        return TrainResult(state, self.history, self.step, final, self.config.run_path,
                           self.skipped)

    def reached_max_steps(self):
        """True once ``max_steps`` (if set) steps are done."""
        return 0 < self.config.max_steps <= self.step

    def _train_epoch(self):
        sums, unit_every, every_check = self.sums, self.every, self.config.check_consistency
        mark = self.regime.comm_seconds
        for positions in self.sampler:
            self.watchdog.arrive(f"step {self.step + 1}")
            if self.step == self.start_step:
                faults.inject("train.first_step", self.rank)
            start = time.perf_counter()
            x, y = self.read_batch(positions)
            loaded = time.perf_counter()
            self.regime.set_lr(self.schedule(self.step))
            loss, correct, count = self.forward_backward(x, y)
            computed = time.perf_counter()
            waited = self.regime.step(lambda: self._update_allowed(loss))
            done = time.perf_counter()
            if self.update_allowed:
                self.count_batch(sums, loss, correct, count)
            sums.data_s += loaded - start
            sums.compute_s += (computed - loaded) + (done - computed - waited)
            sums.exposed_s += waited
            # The communication thread's time, bucket by bucket (NaN under Horovod).
            now = self.regime.comm_seconds
            sums.comm_s += now - mark
            mark = now
            self.step += 1
            self.progress.update(self.sampler.batch, f"loss {loss:.4f}")
            faults.inject("train.step", self.rank)
            if faults.inject("train.perturb", self.rank) == "perturb":
                _perturb(self.model)
            if every_check and self.step % every_check == 0:
                replicas.check_identical(self.model, self.comm, f"at step {self.step} "
                                         f"(--check-consistency {every_check})")
            if unit_every[1] == "step" and unit_every[0] and self.step % unit_every[0] == 0:
                self._save_checkpoint()
            if self.reached_max_steps():
                break

    def read_batch(self, positions):
        """This rank's samples and labels at ``positions`` of the training rows."""
        x, y = self.dataset.read(self.train_rows[positions])
        return (torch.from_numpy(x).to(self.device, self.input_dtype),
                torch.from_numpy(y).to(self.device))

    def forward_backward(self, x, y):
        """Forward and backward on one batch (mean loss): ``(loss, correct, samples)``."""
        self.model.zero_grad(set_to_none=True)
        output = self.model(x)
        if faults.inject("train.grad", self.rank) == "inf":
            output = _InfiniteGradient.apply(output)
        loss = F.cross_entropy(output, y)
        fault = faults.inject("train.loss", self.rank)
        if fault in ("nan", "inf"):
            loss = loss * float(fault)
        loss.backward()
        return loss.item(), (output.argmax(1) == y).sum().item(), len(y)

    @staticmethod
    def count_batch(sums, loss, correct, count):
        """Add one batch's loss and hits to ``sums``."""
        sums.loss += loss * count
        sums.correct += correct
        sums.samples += count

    def _update_allowed(self, loss):
        """Collective (one ``Allgather`` of a byte per rank): may this step's update happen?

        Every rank learns every rank's verdict on its loss and on the gradients it holds, so
        all of them decide alike: a rank that stopped alone would leave the others waiting
        in the next step's allreduce. Sets ``update_allowed``; raises ``NonFiniteError`` on
        every rank under ``--nonfinite error``.
        """
        verdicts = np.zeros(self.size, dtype=np.uint8)
        mine = verdict(loss, self.regime.gradients())
        self.comm.Allgather(np.array([mine], dtype=np.uint8), verdicts)
        self.update_allowed = not verdicts.any()
        if self.update_allowed:
            return True
        what = describe(verdicts)
        where = f"step {self.step + 1} (epoch {self.sampler.epoch + 1})"
        if self.config.nonfinite == "error":
            raise NonFiniteError(f"{what} at {where}: stopping (--nonfinite error); "
                                 f"--nonfinite skip skips such updates instead")
        self.skipped += 1
        self._log(f"[hpctrain] {what} at {where}: update skipped on every rank "
                  f"(--nonfinite skip; {self.skipped} skipped so far)")
        return False

    def _end_epoch(self):
        self.watchdog.arrive(f"end of epoch {self.sampler.epoch + 1}: evaluation and metrics")
        row = self._epoch_row(self.sums, *evaluate(self))
        self.history.append(row)
        if self.rank == 0:
            print(report.epoch_line(row, self.config.epochs), flush=True)
        self.metrics.write(row)
        # A stop at max_steps may fall mid-epoch: the checkpoint then keeps the position
        # inside the epoch. (async-ps has no position inside an epoch: its server reads no
        # batches; a stop there counts as the end of the epoch.)
        complete = self.asynchronous or self.sampler.batch >= len(self.sampler)
        finished = self.reached_max_steps() or (complete and
                                                self.sampler.epoch + 1 >= self.config.epochs)
        count, unit = self.every
        due = unit == "epoch" and complete and count and (self.sampler.epoch + 1) % count == 0
        if count and (due or finished):
            self._save_checkpoint(epoch_done=complete)

    def _epoch_row(self, sums, val_loss, val_acc):
        from mpi4py import MPI

        values = dataclasses.astuple(sums)
        totals = np.array(values, dtype=np.float64)
        self.comm.Allreduce(MPI.IN_PLACE, totals, op=MPI.SUM)
        wall = self.comm.allreduce(sums.wall_s, op=MPI.MAX)
        t = EpochSums(*totals)
        samples = max(t.samples, 1.0)
        updates = t.updates if self.asynchronous else self.step - sums.first_step
        return {
            "epoch": self.sampler.epoch + 1, "steps": int(updates), "step": self.step,
            "lr": self.schedule(max(self.step - 1, 0)),
            "train_loss": t.loss / samples, "train_acc": t.correct / samples,
            "val_loss": val_loss, "val_acc": val_acc, "samples": int(t.samples),
            "samples_per_s": t.samples / wall if wall > 0 else math.nan, "epoch_s": wall,
            "data_s": t.data_s / self.trainers, "compute_s": t.compute_s / self.trainers,
            "exposed_comm_s": t.exposed_s / self.trainers,
            "comm_s": (t.comm_s / self.trainers if not math.isnan(t.comm_s) else math.nan),
            "staleness_mean": (t.staleness / t.updates if self.asynchronous and t.updates
                               else math.nan),
            "staleness_max": t.staleness_max if self.asynchronous else math.nan,
        }

    def _save_checkpoint(self, epoch_done=False):
        """Collective (the sharded regime gathers its optimizer state); rank 0 writes."""
        self.watchdog.arrive(f"checkpoint at step {self.step}")
        optimizer = self.regime.optimizer_state()
        if self.rank != 0:
            faults.inject("train.checkpoint", self.rank)
            return
        position = self.sampler.state_dict()
        if epoch_done:
            position = {"epoch": self.sampler.epoch + 1, "batch": 0, "start": 0}
        sums = EpochSums(first_step=self.step) if epoch_done else self.sums
        checkpoint.save(self.config.run_path / checkpoint.FILENAME, {
            "model": self.model.state_dict(), "optimizer": optimizer, "sampler": position,
            "step": self.step, "epoch_sums": dataclasses.asdict(sums),
            "rng": checkpoint.rng_state(), "config": self.config.to_dict(),
            "world_size": self.size, "regime": self.config.regime},
            keep=self.config.keep_checkpoints)

    # --- ending ------------------------------------------------------------------------------

    def close(self):
        """Release the watchdog, the regime, the communicator and the file (after success)."""
        self.watchdog.close()
        self.regime.close()
        self.comm.Free()
        self.dataset.close()

    def abandon(self, lost=False):
        """After a failure: release what needs no other rank; the job is about to end, or,
        when a rank was ``lost`` (MPI with fault tolerance), to go on without it: then every
        communicator of the run is revoked first, so that no survivor waits in one."""
        if lost:
            for comm in (getattr(self, "comm", None), *_torch_communicators()):
                if comm is not None:
                    revoke(comm)
        regime = getattr(self, "regime", None)
        if regime is not None:
            regime.abandon()
        watchdog = getattr(self, "watchdog", None)
        if watchdog is not None:
            watchdog.stop()


def lost_rank(exc):
    """True when ``exc`` says that a rank died (only an MPI with fault tolerance says so)."""
    return isinstance(exc, ProcessFailure) or process_failure(exc)


def revoke(comm):
    """Revoke ``comm`` (nothing if it is revoked or freed already)."""
    try:
        comm.Revoke()
    except Exception:  # noqa: BLE001,S110 - revoked or freed: nothing to do
        pass


def _torch_communicators():
    # hpctrain.torch's world, which the allreduce regime started on the caller's comm.
    from ..torch import basics

    return basics.world().communicators() if basics.is_initialized() else []


class _InfiniteGradient(torch.autograd.Function):
    """Identity forward, infinite gradient backward: the ``train.grad`` fault."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, math.inf)


def _input_dtype(model):
    # Data sets are read as float32; a float64 (or half-precision) model would fail in its
    # first layer on them, so samples are cast to the dtype of its floating-point weights.
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32


def _perturb(model):
    # The ``train.perturb`` fault: one weight of this rank's replica moves a little.
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-3


def evaluate(run):
    """Collective: validation loss and accuracy over all ranks, each sample counted once.

    Each rank evaluates a disjoint, unpadded shard of the validation rows; sums of loss,
    hits and counts are added over ranks (one ``Allreduce``).
    """
    from mpi4py import MPI

    rows = run.val_rows[shard_indices(len(run.val_rows), run.rank, run.size)]
    sums = np.zeros(3)
    run.model.eval()
    with torch.no_grad():
        for start in range(0, len(rows), run.config.eval_batch_size):
            x, y = run.dataset.read(rows[start:start + run.config.eval_batch_size])
            x = torch.from_numpy(x).to(run.device, run.input_dtype)
            y = torch.from_numpy(y).to(run.device)
            output = run.model(x)
            sums += (F.cross_entropy(output, y, reduction="sum").item(),
                     (output.argmax(1) == y).sum().item(), len(y))
    run.model.train()
    run.comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
    if sums[2] == 0:
        return math.nan, math.nan
    return sums[0] / sums[2], sums[1] / sums[2]
