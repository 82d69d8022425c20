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
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .. import elastic_job
from .. import faults
from ..data import HDF5Dataset, digits
from ..data.torch_dataset import TorchDataset
from ..errors import UsageError
from ..runtime import agree_with_root, checks
from ..sampler import shard_indices
from ..mpi import ulfm
from ..torch.elastic.in_place import lost_rank, recover
from ..watchdog import StallWatchdog
from . import build, checkpoint, header, replicas, report, resume, tensorboard
from .config import checkpoint_interval
from .nonfinite import NonFiniteError, describe, verdict
from .schedule import WarmupSchedule, target_lr
from ..log import logger

LOG = logger()


@dataclass
class TrainResult:
    """What a finished run leaves on every rank."""

    state: dict       # final model state (CPU copies), identical on every rank
    history: list     # one dict per epoch: the rows of metrics.csv
    step: int         # optimizer steps (server updates for async-server) in all
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
    updates: float = 0.0       # async-server: updates the server applied
    staleness: float = 0.0     # async-server: sum of the applied gradients' staleness
    staleness_max: float = 0.0
    server_s: float = 0.0


@dataclass
class Position:
    """Where a run stands: optimizer steps done (server updates under async-server), the step
    this attempt started at, and the updates skipped for a NaN or Inf (``--nonfinite
    skip``; under async-server, by this worker)."""

    step: int = 0
    start: int = 0
    skipped: int = 0
    max_steps: int = 0  # stop once this many steps are done in all (0: no limit)

    def reached_max_steps(self):
        """True once ``max_steps`` (if set) steps are done."""
        return 0 < self.max_steps <= self.step


@dataclass
class RunData:
    """The data side of a run: the data set, its training and validation rows, this rank's
    sampler over the training rows, and how its samples are fed to the model."""

    dataset: object
    train_rows: np.ndarray
    val_rows: np.ndarray
    sampler: object         # hpctrain.sampler.GlobalBatchSampler
    dtype: torch.dtype      # samples are cast to the dtype of the model's weights
    prepared: bool = False  # the digits file was prepared by this run
    # Batches of a whole epoch, counted before a resume, which may start mid-epoch.
    epoch_batches: int = dataclasses.field(init=False)

    def __post_init__(self):
        self.epoch_batches = len(self.sampler)

    def read(self, rows, device):
        """The samples and labels of ``rows`` (indices into the data set), on ``device``."""
        x, y = self.dataset.read(rows)
        return torch.from_numpy(x).to(device, self.dtype), torch.from_numpy(y).to(device)

    def close(self):
        """Close the data set."""
        self.dataset.close()


@dataclass
class Measurements:
    """What a run measures: the running sums of this epoch, one row per epoch done, and
    ``metrics.csv`` and the TensorBoard event files (which only rank 0 writes)."""

    metrics: report.MetricsFile
    sums: EpochSums
    events: tensorboard.EventLog
    history: list = dataclasses.field(default_factory=list)

    def new_epoch(self, first_step):
        """Start this epoch's sums at step ``first_step``."""
        self.sums = EpochSums(first_step=first_step)

    def add(self, row):
        """Keep one epoch's row and append it to ``metrics.csv`` and the event files."""
        self.history.append(row)
        self.metrics.write(row)
        self.events.epoch(row)


def train(config, comm=None):
    """Train as ``config`` says, over ``comm`` (default ``COMM_WORLD``); return the result.

    Collective: every rank of ``comm`` must call it with the same configuration.

    ``--elastic``: the commit is the checkpoint (``--checkpoint-every``, in steps for a
    small loss). A run that loses a rank goes on from the last one, as ``--resume auto``
    would, on the ranks that are left. On an MPI with fault tolerance that happens here, in
    place: the survivors revoke every communicator of the run (:meth:`Run.abandon`), shrink
    the world and start the run again on it (:func:`hpctrain.torch.elastic.in_place.recover`,
    as ``hvd.elastic.run`` does). On any other MPI the job ends, and ``python -m
    hpctrain.launch --elastic`` starts it again on the hosts that are left, where it resumes
    the same way. The rest of an epoch is split
    over the new number of ranks (the sampler counts the samples done), and the learning
    rate is scaled to the new global batch.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    if not config.elastic:
        return train_once(config, comm)
    config = dataclasses.replace(config, resume=config.resume or "auto")
    try:
        return train_once(config, comm)
    except BaseException as exc:
        if not lost_rank(exc):
            raise
    # Whatever checkpoint the first attempt resumed, the next one goes on from the newest in
    # the run directory: the last commit.
    again = dataclasses.replace(config, resume="auto")
    return recover(comm, lambda survivors: train_once(again, survivors))


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
        auto = not config.dataset and digits.is_auto_prepared(config.data)
        # The first collective: every rank's verdict on its own checks, agreed in one
        # allgather, so that bad input ends every rank the same way (a Verdict), whichever
        # rank found it and even when only some did (a file missing on one node).
        with checks(comm):
            resume_path, saved = self._check_inputs(config, open_data=not auto)
        if auto:
            # Every rank decides the same way, from the configuration alone: rank 0 writes
            # the digits (barrier), then the checks that need the rows run on the file.
            prepared = digits.ensure(config.data, comm)
            with checks(comm):
                self._build_from_data(config, HDF5Dataset(config.data, config.x, config.y),
                                      prepared)
        self.comm = comm.Dup()
        try:
            self._start(config, comm, resume_path, saved)
        except BaseException as exc:
            self.abandon(lost_rank(exc))
            raise

    @property
    def asynchronous(self):
        """True under ``--regime async-server``: rank 0 serves, the other ranks train."""
        return self.config.regime == "async-server"

    @property
    def trainers(self):
        """The number of ranks that train (all but the server under async-server)."""
        return self.size - 1 if self.asynchronous else self.size

    @property
    def updates_per_epoch(self):
        """Optimizer steps (server updates under async-server) in a whole epoch."""
        return self.data.epoch_batches * (self.trainers if self.asynchronous else 1)

    def _check_inputs(self, config, open_data):
        """Local checks and builds, no communication: the world size against the regime, the
        checkpoint to resume (its checksum; ``--resume auto`` falls back to an older intact
        one) and its settings, and with ``open_data`` the data and what is built from it.
        Return the checkpoint as ``(path, state)``, or ``(None, None)``. Bad input raises
        ``UsageError``."""
        build.check_run(config, self.rank, self.size)
        resume_path, saved = checkpoint.find(config.resume, config.run_path)
        if saved is not None:
            resume.check_checkpoint(saved, config, self.size, resume_path)
        if open_data:
            dataset = (TorchDataset(config.dataset) if config.dataset else
                       HDF5Dataset(config.data, config.x, config.y))
            self._build_from_data(config, dataset, prepared=False)
        return resume_path, saved

    def _build_from_data(self, config, dataset, prepared):
        """The split, the sampler and the model, each checked against the data (local)."""
        train_rows, val_rows, sampler = build.split_and_sample(config, len(dataset), self.rank,
                                                               self.size)
        random.seed(config.seed)
        np.random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.model = build.make_model(config, dataset)
        self.data = RunData(dataset, train_rows, val_rows, sampler, _input_dtype(self.model),
                            prepared)

    def _start(self, config, comm, resume_path, saved):
        # The collective part of start-up: a failure here must stop the watchdog's thread.
        self.watchdog = StallWatchdog(self.comm, config.stall_warning,
                                      config.stall_timeout or None)
        self.device = build.device(config, self.comm)
        self.model.to(self.device)
        self.regime = build.make_regime(config, self.model, self.comm, comm)
        update_batch = config.batch_size * (1 if self.asynchronous else self.size)
        lr = target_lr(config.lr, update_batch, config.base_batch_size, config.lr_scaling)
        # The schedule spans all epochs; max_steps only stops early and changes no step's lr,
        # so that a run stopped and resumed follows the uninterrupted run exactly.
        per_epoch = self.updates_per_epoch
        self.schedule = WarmupSchedule(config.lr, lr, round(config.warmup_epochs * per_epoch),
                                       config.epochs * per_epoch, config.lr_decay)
        step, sums = 0, EpochSums()
        # On every rank, with a checkpoint or without: ranks that found different ones are
        # told so by the check after it, in the same order of collectives.
        with checks(self.comm):
            if saved is not None:
                step, sums = self._restore(saved, resume_path)
        self.position = Position(step, start=step, max_steps=config.max_steps)
        self._check_same_start(resume_path)
        faults.inject("train.start", self.rank)
        self.watchdog.arrive("start-up broadcast")
        self.regime.broadcast_initial()
        checksum = replicas.check_identical(self.model, self.comm, "after the initial broadcast")
        if config.elastic:
            # Every rank has started and has the state.
            elastic_job.log_up(self.rank, np=self.size)
        # A resumed run drops the rows written after its checkpoint: they are trained again.
        metrics = report.MetricsFile(config.run_path / "metrics.csv", append=saved is not None,
                                     enabled=self.rank == 0,
                                     epochs_done=self.data.sampler.epoch)
        events = tensorboard.EventLog(config.tensorboard_path, config, enabled=self.rank == 0,
                                      purge_step=step + 1 if saved is not None else None)
        self.measured = Measurements(metrics, sums, events)
        if self.rank == 0:
            header.write(config, self.data, self.model, self.regime, size=self.size,
                         device=self.device, schedule=self.schedule, updates_per_epoch=per_epoch,
                         resumed_from=resume_path if saved is not None else None, step=step,
                         checksum=checksum)

    # --- start-up ---------------------------------------------------------------------------

    def _restore(self, saved, path):
        try:
            self.model.load_state_dict(saved["model"])
            self.regime.load_optimizer_state(saved["optimizer"])
            saved_trainers = saved["world_size"] - (1 if self.asynchronous else 0)
            self.data.sampler.load_state_dict(saved["sampler"], size=saved_trainers)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise UsageError(f"checkpoint {str(path)!r} does not fit this run: "
                             f"{exc}") from None
        step, sums = saved["step"], EpochSums(**saved["epoch_sums"])
        checkpoint.set_rng_state(saved["rng"])
        return step, sums

    def _check_same_start(self, resume_path):
        """Collective: every rank starts at rank 0's position (one allgather).

        Ranks that found different checkpoints (``--resume auto`` with a run directory that
        is not on a shared file system) would run different numbers of steps and hang in a
        collective; they stop together here instead, with the same ``Verdict``.
        """
        start = (str(resume_path), self.data.sampler.state_dict(), self.position.step)
        agree_with_root(self.comm, start, lambda root: (
            f"a start other than rank 0's {root}: is the run directory on a file system all "
            f"ranks share?"))

    # --- training ----------------------------------------------------------------------------

    def fit(self):
        """Train epoch after epoch until ``epochs`` or ``max_steps``; return the result."""
        sampler = self.data.sampler
        while sampler.epoch < self.config.epochs:
            label = f"epoch {sampler.epoch + 1}/{self.config.epochs}"
            progress = report.Progress(self.updates_per_epoch, label, report.progress_enabled(
                self.config.progress, self.rank))
            if sampler.batch == 0:
                self.measured.new_epoch(self.position.step)
            sums = self.measured.sums
            started = time.perf_counter()
            if self.asynchronous:
                # The regime advances a position of its own and returns it.
                self.position = self.regime.train_epoch(self, sums, progress)
            else:
                self._train_epoch(sums, progress)
            sums.wall_s += time.perf_counter() - started
            progress.close()
            self._end_epoch()
            if self.position.reached_max_steps():
                break
            sampler.set_epoch(sampler.epoch + 1)
        self.watchdog.arrive("final weight check")
        final = replicas.check_identical(self.model, self.comm, "at the end of training")
        state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        return TrainResult(state, self.measured.history, self.position.step, final,
                           self.config.run_path, self.position.skipped)

    def _train_epoch(self, sums, progress):
        position, sampler = self.position, self.data.sampler
        every, unit = checkpoint_interval(self.config.checkpoint_every)
        every_check = self.config.check_consistency
        mark = self.regime.comm_seconds
        for positions in sampler:
            self.watchdog.arrive(f"step {position.step + 1}")
            if position.step == position.start:
                faults.inject("train.first_step", self.rank)
            start = time.perf_counter()
            x, y = self.read_batch(positions)
            loaded = time.perf_counter()
            lr = self.schedule(position.step)
            self.regime.set_lr(lr)
            loss, correct, count = self.forward_backward(x, y)
            computed = time.perf_counter()
            done = self.regime.step(lambda: self._update_allowed(loss))
            finished = time.perf_counter()
            if done.updated:
                self.count_batch(sums, loss, correct, count)
            data_s, exposed_s = loaded - start, done.waited
            compute_s = (computed - loaded) + (finished - computed - exposed_s)
            sums.data_s += data_s
            sums.compute_s += compute_s
            sums.exposed_s += exposed_s
            # The communication thread's time, bucket by bucket (NaN under Horovod).
            now = self.regime.comm_seconds
            sums.comm_s += now - mark
            mark = now
            position.step += 1
            self.measured.events.step(position.step, loss, lr, data_s, compute_s, exposed_s)
            progress.update(sampler.batch, f"loss {loss:.4f}")
            faults.inject("train.step", self.rank)
            if faults.inject("train.perturb", self.rank) == "perturb":
                _perturb(self.model)
            if every_check and position.step % every_check == 0:
                replicas.check_identical(self.model, self.comm, f"at step {position.step} "
                                         f"(--check-consistency {every_check})")
            if unit == "step" and every and position.step % every == 0:
                self._save_checkpoint()
            if position.reached_max_steps():
                break

    def read_batch(self, positions):
        """This rank's samples and labels at ``positions`` of the training rows."""
        return self.data.read(self.data.train_rows[positions], self.device)

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
        in the next step's allreduce. A skipped update is counted and reported here; under
        ``--nonfinite error`` every rank raises ``NonFiniteError`` instead.
        """
        verdicts = np.zeros(self.size, dtype=np.uint8)
        mine = verdict(loss, self.regime.gradients())
        self.comm.Allgather(np.array([mine], dtype=np.uint8), verdicts)
        if not verdicts.any():
            return True
        what = describe(verdicts)
        where = f"step {self.position.step + 1} (epoch {self.data.sampler.epoch + 1})"
        if self.config.nonfinite == "error":
            raise NonFiniteError(f"{what} at {where}: stopping (--nonfinite error); "
                                 f"--nonfinite skip skips such updates instead")
        self.position.skipped += 1
        LOG.warning(f"{what} at {where}: update skipped on every rank (--nonfinite skip; "
                    f"{self.position.skipped} skipped so far)")
        return False

    def _end_epoch(self):
        sampler = self.data.sampler
        self.watchdog.arrive(f"end of epoch {sampler.epoch + 1}: evaluation and metrics")
        val_loss, val_acc = evaluate(self.model, self.data, self.comm, self.device,
                                     self.config.eval_batch_size)
        row = self._epoch_row(self.measured.sums, val_loss, val_acc)
        if self.rank == 0:
            print(report.epoch_line(row, self.config.epochs), flush=True)
        self.measured.add(row)
        # A stop at max_steps may fall mid-epoch: the checkpoint then keeps the position
        # inside the epoch. (async-server has no position inside an epoch: its server reads no
        # batches; a stop there counts as the end of the epoch.)
        complete = self.asynchronous or sampler.batch >= len(sampler)
        finished = self.position.reached_max_steps() or (
            complete and sampler.epoch + 1 >= self.config.epochs)
        count, unit = checkpoint_interval(self.config.checkpoint_every)
        due = unit == "epoch" and complete and count and (sampler.epoch + 1) % count == 0
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
        step = self.position.step
        updates = t.updates if self.asynchronous else step - sums.first_step
        return {
            "epoch": self.data.sampler.epoch + 1, "steps": int(updates), "step": step,
            "lr": self.schedule(max(step - 1, 0)),
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
        step, sampler = self.position.step, self.data.sampler
        self.watchdog.arrive(f"checkpoint at step {step}")
        optimizer = self.regime.optimizer_state()
        if self.rank != 0:
            faults.inject("train.checkpoint", self.rank)
            return
        position = sampler.state_dict()
        if epoch_done:
            position = {"epoch": sampler.epoch + 1, "batch": 0, "start": 0}
        sums = EpochSums(first_step=step) if epoch_done else self.measured.sums
        checkpoint.save(self.config.run_path / checkpoint.FILENAME, {
            "model": self.model.state_dict(), "optimizer": optimizer, "sampler": position,
            "step": step, "epoch_sums": dataclasses.asdict(sums),
            "rng": checkpoint.rng_state(), "config": self.config.to_dict(),
            "world_size": self.size, "regime": self.config.regime},
            keep=self.config.keep_checkpoints)

    # --- ending ------------------------------------------------------------------------------

    def close(self):
        """Release the watchdog, the regime, the communicator and the file (after success)."""
        self.watchdog.close()
        self.regime.close()
        self.comm.Free()
        self.data.close()
        self.measured.events.close()

    def abandon(self, lost=False):
        """After a failure: release what needs no other rank; the job is about to end, or,
        when a rank was ``lost`` (MPI with fault tolerance), to go on without it: then every
        communicator of the run is revoked first, so that no survivor waits in one."""
        if lost:
            for comm in (getattr(self, "comm", None), *_torch_communicators()):
                if comm is not None:
                    ulfm.revoke(comm)
        regime = getattr(self, "regime", None)
        if regime is not None:
            regime.abandon()
        watchdog = getattr(self, "watchdog", None)
        if watchdog is not None:
            watchdog.stop()
        measured = getattr(self, "measured", None)
        if measured is not None:
            measured.events.close()     # what this rank wrote since the last epoch's flush


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


def evaluate(model, data, comm, device, batch_size):
    """Collective: ``model``'s validation loss and accuracy on ``data`` (a :class:`RunData`)
    over all ranks of ``comm``, each sample counted once.

    Each rank evaluates a disjoint, unpadded shard of the validation rows, ``batch_size``
    rows at a time on ``device``; sums of loss, hits and counts are added over ranks (one
    ``Allreduce``).
    """
    from mpi4py import MPI

    rows = data.val_rows[shard_indices(len(data.val_rows), comm.Get_rank(), comm.Get_size())]
    sums = np.zeros(3)
    model.eval()
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            x, y = data.read(rows[start:start + batch_size], device)
            output = model(x)
            sums += (F.cross_entropy(output, y, reduction="sum").item(),
                     (output.argmax(1) == y).sum().item(), len(y))
    model.train()
    comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
    if sums[2] == 0:
        return math.nan, math.nan
    return sums[0] / sums[2], sums[1] / sums[2]
