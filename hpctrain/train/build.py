"""Building a run from its configuration: checks, sampler, model, optimizer, regime, device.

Everything here but :func:`make_regime` and :func:`device` is local (no communication), so
that bad input raises ``UsageError`` on every rank alike before the first collective. This
module imports no torch (the model and optimizer import it when built): ``hpctrain train``
runs :func:`check_without_torch` before it, so that bad input costs no rank torch's import.
"""

import importlib

from ..data import HDF5Dataset, digits, split_indices
from ..devices import rank_device
from ..errors import UsageError
from ..gpu_checks import check_cuda_visible, check_horovod_cuda
from ..models import build_model
from ..sampler import GlobalBatchSampler
from . import tensorboard
from .config import REGIMES, checkpoint_interval


def check_without_torch(config, rank, size):
    """Local, no communication, no torch: ``UsageError`` if this rank's first problem is one
    that :class:`hpctrain.train.loop.Run`'s checks find before they need torch.

    The same checks in the same order, up to the first that needs torch (a checkpoint to
    resume, a torch dataset, the model) or the digits file that start-up may prepare. A
    rank that fails here would fail there with the same message: ``hpctrain train`` joins
    the start-up verdict with it without importing torch (1.4 s of CPU per rank). A rank
    that passes goes on to the whole checks, these again included (the file is opened and
    its labels scanned twice: milliseconds).
    """
    check_run(config, rank, size)
    if (config.resume or config.elastic or config.dataset
            or digits.is_auto_prepared(config.data)):
        return
    with HDF5Dataset(config.data, config.x, config.y) as dataset:
        split_and_sample(config, len(dataset), rank, size)


def check_run(config, rank, size):
    """The first local checks of a run: the world size against the regime and device, and
    on rank 0 the ``--tensorboard`` folder (only rank 0 writes there)."""
    check_world(config, size)
    if config.tensorboard_path is not None and rank == 0:
        tensorboard.check(config.tensorboard_path)


def split_and_sample(config, num_rows, rank, size):
    """The training and validation rows of a data set of ``num_rows`` rows, and this rank's
    sampler over the training rows: ``(train_rows, val_rows, sampler)``."""
    train_rows, val_rows = split_indices(num_rows, config.val_fraction, config.split_seed)
    return train_rows, val_rows, make_sampler(config, len(train_rows), rank, size)


def check_world(config, size):
    """``UsageError`` (on every rank alike) for a world size or device the run cannot use."""
    if config.regime == "async-server":
        if size < 2:
            raise UsageError("--regime async-server needs at least 2 ranks: rank 0 serves, the "
                             "others train")
        if checkpoint_interval(config.checkpoint_every)[1] == "step":
            raise UsageError("--regime async-server checkpoints at epoch ends only: use "
                             "--checkpoint-every N (epochs)")
        if config.check_consistency:
            # Asynchronous workers hold different weights by design: a comparison would
            # report a divergence at every check.
            raise UsageError("--check-consistency compares replicas that train in lockstep; "
                             "under --regime async-server the workers' weights differ by design: "
                             "use --check-consistency 0 or another regime")
    if config.elastic and (config.regime != "allreduce" or config.allreduce == "horovod"):
        # The servers' roles and shards are fixed to ranks, and Horovod keeps its own world:
        # neither can go on with fewer ranks.
        raise UsageError(f"--elastic needs --regime allreduce with one of hpctrain's "
                         f"algorithms (this run: --regime {config.regime} --allreduce "
                         f"{config.allreduce})")
    if config.device == "cuda":
        check_cuda_visible("--device cuda")


def make_sampler(config, num_rows, rank, size):
    """This rank's ``GlobalBatchSampler`` over ``num_rows`` training rows."""
    if num_rows == 0:
        raise UsageError(f"--val-fraction {config.val_fraction:g} leaves no training rows of "
                         f"{config.data!r}: lower it, or use a larger data set")
    if config.regime == "async-server":
        rank, size = max(rank - 1, 0), size - 1  # the server takes no batches
    try:
        return GlobalBatchSampler(num_rows, config.batch_size, rank, size,
                                  shuffle=config.shuffle, seed=config.seed,
                                  drop_last=config.drop_last)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def make_model(config, dataset):
    """The model ``config.model`` names, for ``dataset``'s samples and classes."""
    try:
        return build_model(config.model, dataset.sample_shape, dataset.num_classes,
                           hidden=config.hidden, model_mb=config.model_mb, seed=config.seed)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def optimizer_factory(config):
    """``params -> optimizer`` as the configuration says (SGD with momentum, or Adam)."""
    import torch

    if config.optimizer == "adam":
        return lambda params: torch.optim.Adam(params, lr=config.lr,
                                               weight_decay=config.weight_decay)
    return lambda params: torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                                          weight_decay=config.weight_decay)


def make_regime(config, model, comm, user_comm):
    """The regime of ``config`` over ``comm`` (``user_comm``: the caller's, for init)."""
    from mpi4py import MPI

    make_optimizer = optimizer_factory(config)
    # Overlap needs the communication thread to call MPI: SERIALIZED suffices, since the
    # main thread makes no MPI call while buckets are being reduced.
    overlap = config.overlap and MPI.Query_thread() >= MPI.THREAD_SERIALIZED
    options = {"bucket_mb": config.bucket_mb, "overlap": overlap}
    regime = regime_class(config.regime)
    if config.regime != "allreduce":
        return regime(model, make_optimizer, comm, **options)
    if config.allreduce == "auto":
        from ..collectives import auto

        auto.use(auto.load(config.allreduce_profile, comm))   # read by rank 0, broadcast
    if config.device == "cuda" and config.allreduce == "horovod":
        # Before hvd.init, after each rank chose its GPU (device()): Horovod built without
        # CUDA, or NCCL with two ranks on one GPU, would otherwise fail in C++ with a
        # traceback. Collective: every rank of this configuration reaches it.
        check_horovod_cuda(comm, "--allreduce horovod with --device cuda")
    # hpctrain.torch (and Horovod) keep the communicator they are started with: give them
    # the caller's, which outlives this run, not our duplicate, which close() frees.
    return regime(model, make_optimizer, user_comm, algo=config.allreduce, **options)


def regime_class(name):
    """The class of the regime ``name`` (:data:`.config.REGIMES`)."""
    module, _, cls = REGIMES[name].rpartition(".")
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)


def device(config, comm):
    """The rank's device (collective for cuda: the node-local rank picks the GPU)."""
    return rank_device(config.device, comm)
