"""The ``#`` header rank 0 prints at the start of a run, and its ``config.toml``."""

from ..models import parameter_bytes


def write(run):
    """Rank 0: write ``config.toml`` and print the ``#`` header of the run."""
    from mpi4py import MPI

    c, path = run.config, run.config.run_path
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(c.to_toml())
    levels = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED",
              MPI.THREAD_SERIALIZED: "SERIALIZED", MPI.THREAD_MULTIPLE: "MULTIPLE"}
    how = f"allreduce {c.allreduce}" if c.regime == "allreduce" else f"regime {c.regime}"
    shape = "x".join(map(str, run.dataset.sample_shape))
    params = sum(p.numel() for p in run.model.parameters())
    lines = [
        f"hpctrain train: {run.size} rank{'s' if run.size > 1 else ''}, {how}, "
        f"device {run.device}, MPI thread level {levels.get(MPI.Query_thread(), '?')}",
        f"data {c.dataset or c.data}{' (prepared now)' if run.prepared else ''}: "
        f"{len(run.dataset)} samples of {shape}, {run.dataset.num_classes} classes; "
        f"{len(run.train_rows)} train / {len(run.val_rows)} validation rows",
        batch_line(run),
        lr_line(run),
        f"model {c.model}: {params:,} parameters ({parameter_bytes(run.model) / 2**20:.2f}"
        f" MB){bucket_text(run)}",
        f"run directory {path}" + (f" (resumed from {run.resume_path} at epoch "
                                   f"{run.sampler.epoch + 1}, step {run.step})"
                                   if run.saved is not None else ""),
        f"weights identical on all ranks after the broadcast "
        f"(checksum {run.initial_checksum:014x})",
        "configuration:"] + [f"  {line}" for line in c.to_toml().splitlines()]
    print("\n".join(f"# {line}" for line in lines), flush=True)

def batch_line(run):
    """The global batch and steps per epoch."""
    c, s = run.config, run.sampler
    if run.asynchronous:
        return (f"batch {c.batch_size} per worker x {run.trainers} workers (rank 0 serves); "
                f"{run.updates_per_epoch} updates per epoch")
    return (f"global batch {s.global_batch_size} = {c.batch_size} per rank x {run.size} "
            f"ranks; {len(s)} steps per epoch ({s.padding} padded samples per epoch)"
            if not c.drop_last else
            f"global batch {s.global_batch_size} = {c.batch_size} per rank x {run.size} "
            f"ranks; {len(s)} steps per epoch (drop_last)")

def lr_line(run):
    """The learning rate, its scaling, warm-up and decay."""
    c = run.config
    scaled = (f"lr {run.lr:g} = {c.lr:g} x {run.lr / c.lr * c.base_batch_size:g} / "
              f"{c.base_batch_size} (linear scaling)" if c.lr_scaling == "linear"
              else f"lr {run.lr:g} (no scaling)")
    if run.warmup_steps:
        scaled += (f", warm-up from {c.lr:g} over {c.warmup_epochs:g} epochs "
                   f"({run.warmup_steps} steps)")
    if c.lr_decay == "cosine":
        scaled += f", then cosine decay to 0 at step {run.schedule.total_steps}"
    return scaled

def bucket_text(run):
    """The gradient buckets, if the regime has any."""
    buckets = getattr(run.regime, "buckets", None)
    if buckets is None:
        return ""
    return (f", {len(buckets)} gradient bucket(s) of <= {run.config.bucket_mb:g} MB"
            f", overlap {'on' if run.regime.overlap else 'off'}")
