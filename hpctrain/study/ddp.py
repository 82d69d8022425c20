"""The baseline of ``study train``: PyTorch ``DistributedDataParallel`` (gloo) on hpctrain's
model, data, sampler and learning-rate schedule.

    mpirun -np 4 python -m hpctrain.study.ddp --model mlp --batch-size 32 --epochs 3 \\
        --run-dir runs/ddp --progress never

It reads the configuration keys of ``hpctrain train`` with train's own parser and defaults,
and builds what train builds from them: the model (``hpctrain.models``, same seed, so the
same initial weights), the seeded train/validation split, ``hpctrain.sampler``'s batches
(rank r reads the same rows at every step as rank r of ``hpctrain train``), the optimizer
and the warm-up/decay schedule. Gradients are averaged by DDP over gloo instead of by an
hpctrain regime; ``--bucket-mb`` becomes DDP's ``bucket_cap_mb`` (its first bucket too).
Rank and world size come from MPI; gloo meets at a TCP store on rank 0 (see
:func:`hpctrain.torch.ddp.rendezvous`).

``metrics.csv`` has train's columns, and ``samples_per_s`` the same definition: every rank's
training samples (padding included) over the slowest rank's time for the epoch's training
steps (reading, forward, backward with the overlapped allreduces, update), summed and maxed
over ranks with MPI as train does. What differs from train, and so is not measured here:

- no validation pass (``val_loss``/``val_acc`` are empty; train runs it outside the timed
  window), no checkpoints, no weight-consistency checks, no stall watchdog;
- train makes one more small collective per step (an ``Allgather`` of one byte per rank
  that checks the loss and gradients are finite); DDP has none;
- ``exposed_comm_s`` and ``comm_s`` are empty: DDP does not say how long it waited;
- gloo moves bytes over TCP sockets even between ranks of one host, where Open MPI (and so
  hpctrain's algorithms and Horovod) uses shared memory.

``--tensorboard`` writes the epochs' rows as train does (no per-step scalars).

Keys that choose hpctrain's own communication (``--allreduce``, ``--overlap``, the stall and
consistency settings) are accepted and ignored; ``--regime`` other than ``allreduce``,
``--device cuda`` and ``--resume`` are refused.
"""

import datetime
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..data import HDF5Dataset, digits, split_indices
from ..errors import UsageError
from ..runtime import run_guarded
from ..train import report, tensorboard
from ..train.config import load_config, parse_overrides
from ..train.build import make_model, make_sampler, optimizer_factory
from ..torch.ddp import rendezvous
from ..train.schedule import WarmupSchedule, target_lr

def main(argv=None):
    """``python -m hpctrain.study.ddp [--key=value ...]`` on every rank."""
    return run_guarded(run, sys.argv[1:] if argv is None else argv)


def run(argv):
    """Train with DDP as the configuration keys in ``argv`` say; return 0."""
    config = load_config(None, parse_overrides(argv))
    _check_supported(config)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD.Dup()
    try:
        train(config, comm)
    finally:
        comm.Free()
    return 0


def train(config, comm):
    """Collective over ``comm``: the whole DDP run; returns the epochs' metrics rows."""
    torch.set_num_threads(config.threads)
    rank, size = comm.Get_rank(), comm.Get_size()
    if digits.is_auto_prepared(config.data):
        digits.ensure(config.data, comm)        # collective: rank 0 writes, all wait
    dataset = HDF5Dataset(config.data, config.x, config.y)
    train_rows, _ = split_indices(len(dataset), config.val_fraction, config.split_seed)
    sampler = make_sampler(config, len(train_rows), rank, size)
    torch.manual_seed(config.seed)
    model = make_model(config, dataset)
    # A collective that waits longer than --stall-timeout raises instead of hanging.
    timeout = datetime.timedelta(seconds=config.stall_timeout or 600)
    store = rendezvous(comm, timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=timeout)
    try:
        # DDP broadcasts rank 0's weights here (train broadcasts them too).
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=config.bucket_mb)
        return _fit(config, comm, ddp, dataset, train_rows, sampler)
    finally:
        dist.destroy_process_group()
        dataset.close()


def _fit(config, comm, ddp, dataset, train_rows, sampler):
    rank, size = comm.Get_rank(), comm.Get_size()
    optimizer = optimizer_factory(config)(ddp.parameters())
    steps_per_epoch = len(sampler)
    schedule = WarmupSchedule(
        config.lr, target_lr(config.lr, config.batch_size * size, config.base_batch_size,
                             config.lr_scaling),
        round(config.warmup_epochs * steps_per_epoch), config.epochs * steps_per_epoch,
        config.lr_decay)
    metrics = report.MetricsFile(config.run_path / "metrics.csv", enabled=rank == 0)
    # The epochs' rows only: the per-step scalars are train's.
    events = tensorboard.EventLog(config.tensorboard_path, config, enabled=rank == 0)
    if rank == 0:
        print(f"# ddp baseline: {size} rank(s), gloo, model {config.model}, global batch "
              f"{sampler.global_batch_size} = {config.batch_size} per rank x {size}; "
              f"{steps_per_epoch} steps per epoch; bucket_cap_mb {config.bucket_mb:g}",
              flush=True)
    step, history = 0, []
    for epoch in range(config.epochs):
        sampler.set_epoch(epoch)
        first = step
        sums, wall, step = _train_epoch(config, ddp, optimizer, schedule, dataset,
                                        train_rows, sampler, step)
        row = _epoch_row(comm, epoch, step, step - first, schedule, sums, wall)
        history.append(row)
        if rank == 0:
            print(report.epoch_line(row, config.epochs), flush=True)
        metrics.write(row)
        events.epoch(row)
        if 0 < config.max_steps <= step:
            break
    events.close()
    return history


def _train_epoch(config, ddp, optimizer, schedule, dataset, train_rows, sampler, step):
    # The timed window is train's: from the first batch read to the last update.
    sums = np.zeros(5)   # loss x samples, correct, samples, data_s, compute_s
    started = time.perf_counter()
    for positions in sampler:
        start = time.perf_counter()
        x, y = dataset.read(train_rows[positions])
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        loaded = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = schedule(step)
        optimizer.zero_grad(set_to_none=True)
        output = ddp(x)
        loss = F.cross_entropy(output, y)
        loss.backward()         # synchronisation: DDP's bucketed allreduces, all ranks alike
        optimizer.step()
        sums += (loss.item() * len(y), (output.argmax(1) == y).sum().item(), len(y),
                 loaded - start, time.perf_counter() - loaded)
        step += 1
        if 0 < config.max_steps <= step:
            break
    return sums, time.perf_counter() - started, step


def _epoch_row(comm, epoch, step, steps, schedule, sums, wall):
    """Collective (an ``Allreduce`` of the sums and one of the time): the metrics row."""
    from mpi4py import MPI

    comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
    wall = comm.allreduce(wall, op=MPI.MAX)
    loss, correct, samples, data_s, compute_s = sums
    size, nan = comm.Get_size(), math.nan
    return {"epoch": epoch + 1, "steps": steps, "step": step,
            "lr": schedule(max(step - 1, 0)), "train_loss": loss / max(samples, 1),
            "train_acc": correct / max(samples, 1), "val_loss": nan, "val_acc": nan,
            "samples": int(samples), "samples_per_s": samples / wall if wall > 0 else nan,
            "epoch_s": wall, "data_s": data_s / size, "compute_s": compute_s / size,
            "exposed_comm_s": nan, "comm_s": nan, "staleness_mean": nan,
            "staleness_max": nan}


def _check_supported(config):
    if config.regime != "allreduce":
        raise UsageError(f"the DDP baseline is synchronous allreduce; --regime {config.regime} "
                         "has no DDP counterpart")
    if config.device != "cpu":
        raise UsageError("the DDP baseline runs gloo on CPU only: use --device cpu")
    if config.resume:
        raise UsageError("the DDP baseline writes no checkpoints and cannot --resume")
    if config.tensorboard_path is not None:
        tensorboard.check(config.tensorboard_path)


def _exit(code):
    """End the process without Python's finalization, MPI finalized and output flushed.

    gloo's worker threads (``pt_gloo_runloop``) outlive ``destroy_process_group`` and DDP
    itself; one that finishes a work item while the interpreter is finalizing calls into
    Python, is ended by it inside a C++ frame that cannot unwind, and the rank aborts
    (SIGABRT from ``ProcessGroupGloo::runLoop``, seen at np 2 after a complete run).
    Nothing is left to run at this point: the metrics file is closed after every row.
    """
    from mpi4py import MPI

    sys.stdout.flush()
    sys.stderr.flush()
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    os._exit(code or 0)


if __name__ == "__main__":
    _exit(main())
