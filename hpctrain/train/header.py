"""The ``#`` header rank 0 prints at the start of a run, and its ``config.toml``."""

from ..data.atomic import write_text
from ..models import parameter_bytes


def write(config, data, model, regime, *, size, device, schedule, updates_per_epoch,
          resumed_from, step, checksum):
    """Rank 0: write ``config.toml`` and print the ``#`` header of the run.

    ``data``: the run's data side (data set, split, sampler); ``resumed_from``: the
    checkpoint it resumed, or ``None``; ``step``: where it starts; ``checksum``: of the
    weights every rank holds after the initial broadcast.
    """
    from mpi4py import MPI

    c, path = config, config.run_path
    path.mkdir(parents=True, exist_ok=True)
    write_text(path / "config.toml", c.to_toml())
    levels = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED",
              MPI.THREAD_SERIALIZED: "SERIALIZED", MPI.THREAD_MULTIPLE: "MULTIPLE"}
    how = f"allreduce {c.allreduce}" if c.regime == "allreduce" else f"regime {c.regime}"
    dataset = data.dataset
    shape = "x".join(map(str, dataset.sample_shape))
    params = sum(p.numel() for p in model.parameters())
    lines = [
        f"hpctrain train: {size} rank{'s' if size > 1 else ''}, {how}, "
        f"device {device}, MPI thread level {levels.get(MPI.Query_thread(), '?')}",
        f"data {c.dataset or c.data}{' (prepared now)' if data.prepared else ''}: "
        f"{len(dataset)} samples of {shape}, {dataset.num_classes} classes; "
        f"{len(data.train_rows)} train / {len(data.val_rows)} validation rows",
        batch_line(c, data.sampler, size, updates_per_epoch),
        lr_line(c, schedule),
        f"model {c.model}: {params:,} parameters ({parameter_bytes(model) / 2**20:.2f}"
        f" MB){bucket_text(c, regime)}",
        f"run directory {path}" + (f" (resumed from {resumed_from} at epoch "
                                   f"{data.sampler.epoch + 1}, step {step})"
                                   if resumed_from is not None else ""),
        f"weights identical on all ranks after the broadcast "
        f"(checksum {checksum:014x})",
        "configuration:"] + [f"  {line}" for line in c.to_toml().splitlines()]
    print("\n".join(f"# {line}" for line in lines), flush=True)

def batch_line(config, sampler, size, updates_per_epoch):
    """The global batch and steps per epoch of ``sampler`` over ``size`` ranks."""
    c, s = config, sampler
    if c.regime == "async-server":
        return (f"batch {c.batch_size} per worker x {size - 1} workers (rank 0 serves); "
                f"{updates_per_epoch} updates per epoch")
    return (f"global batch {s.global_batch_size} = {c.batch_size} per rank x {size} "
            f"ranks; {len(s)} steps per epoch ({s.padding} padded samples per epoch)"
            if not c.drop_last else
            f"global batch {s.global_batch_size} = {c.batch_size} per rank x {size} "
            f"ranks; {len(s)} steps per epoch (drop_last)")

def lr_line(config, schedule):
    """The learning rate, its scaling, warm-up and decay (``schedule``: a
    :class:`~hpctrain.train.schedule.WarmupSchedule`)."""
    c, lr = config, schedule.target
    scaled = (f"lr {lr:g} = {c.lr:g} x {lr / c.lr * c.base_batch_size:g} / "
              f"{c.base_batch_size} (linear scaling)" if c.lr_scaling == "linear"
              else f"lr {lr:g} (no scaling)")
    if schedule.warmup_steps:
        scaled += (f", warm-up from {c.lr:g} over {c.warmup_epochs:g} epochs "
                   f"({schedule.warmup_steps} steps)")
    if c.lr_decay == "cosine":
        scaled += f", then cosine decay to 0 at step {schedule.total_steps}"
    return scaled

def bucket_text(config, regime):
    """The gradient buckets, if the regime has any."""
    buckets = getattr(regime, "buckets", None)
    if buckets is None:
        return ""
    return (f", {len(buckets)} gradient bucket(s) of <= {config.bucket_mb:g} MB"
            f", overlap {'on' if regime.overlap else 'off'}")
