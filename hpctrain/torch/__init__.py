"""``hpctrain.torch``: Horovod's ``horovod.torch`` API, with the algorithms chosen.

A script written for Horovod runs with one changed line::

    import hpctrain.torch as hvd        # instead of: import horovod.torch as hvd

    hvd.init()                          # or hvd.init(allreduce="tree")
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

and is launched as before (``mpirun -np 4 python train.py``). The allreduce algorithm is the
``allreduce=`` argument of ``init``, else ``$HPCTRAIN_ALLREDUCE``, else ``ring``: any name of
``hpctrain.collectives.available()``; the other collectives use their own algorithm of the
same family. ``horovod`` hands every call to the real Horovod. :func:`comm_hook` does the
same for PyTorch DDP scripts.

Every collective of ``horovod.torch`` is here: ``allreduce``, ``allgather``, ``broadcast``,
``reducescatter``, ``alltoall``, in their ``_async``, in-place and ``grouped_`` forms,
differentiable; ops ``Average``, ``Sum``, ``Min``, ``Max``, ``Product``, ``Adasum``; sparse
allreduce; process sets (``ProcessSet``, ``add_process_set``, ``remove_process_set``,
``process_set=``); ``join``; ``barrier``; ``SyncBatchNorm``; ``DistributedOptimizer``;
``broadcast_parameters``, ``broadcast_optimizer_state``, ``broadcast_object``,
``allgather_object``; ``start_timeline``/``stop_timeline``; ``Compression``. Operations are
paired across ranks by name, as in Horovod (see :mod:`hpctrain.torch.engine`). Elastic
training (``hvd.elastic``) is here too, on MPI (:mod:`hpctrain.torch.elastic`), where
Horovod's needs its own launcher and Gloo. Not offered: the Gloo and NCCL controllers;
using them raises an error that says what to use instead.
"""

from functools import wraps

from .backends import NATIVE as _NATIVE
from .backends import backend
from .basics import (algorithm, ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                     gloo_built, gloo_enabled, is_homogeneous, is_initialized, local_rank,
                     local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
                     rank, rocm_built, shutdown, size)
from .compression import Compression
from .ddp import comm_hook, init_process_group
from .engine import HorovodInternalError
from .elastic import HostsUpdatedInterrupt
from .lifecycle import init
from .ops import Adasum, Average, Max, Min, Product, Sum
from .process_sets import ProcessSet, global_process_set
from . import elastic


def _public(name):
    """The function ``name`` of the backend in use (:func:`backend`): hpctrain's own, or
    Horovod's if ``init`` chose it. (The backend is known only at ``init``: each public
    function below is this forwarder, named where a reader looks for it.)"""
    @wraps(getattr(_NATIVE, name))
    def call(*args, **kwargs):
        return getattr(backend(), name)(*args, **kwargs)
    return call


# The collectives, in Horovod's names: hpctrain.torch.ops.<name> unless init chose Horovod.
allreduce = _public("allreduce")
allreduce_ = _public("allreduce_")
allreduce_async = _public("allreduce_async")
allreduce_async_ = _public("allreduce_async_")
grouped_allreduce = _public("grouped_allreduce")
grouped_allreduce_ = _public("grouped_allreduce_")
grouped_allreduce_async = _public("grouped_allreduce_async")
grouped_allreduce_async_ = _public("grouped_allreduce_async_")
sparse_allreduce_async = _public("sparse_allreduce_async")
allgather = _public("allgather")
allgather_async = _public("allgather_async")
grouped_allgather = _public("grouped_allgather")
grouped_allgather_async = _public("grouped_allgather_async")
allgather_object = _public("allgather_object")
broadcast = _public("broadcast")
broadcast_ = _public("broadcast_")
broadcast_async = _public("broadcast_async")
broadcast_async_ = _public("broadcast_async_")
broadcast_object = _public("broadcast_object")
reducescatter = _public("reducescatter")
reducescatter_async = _public("reducescatter_async")
grouped_reducescatter = _public("grouped_reducescatter")
grouped_reducescatter_async = _public("grouped_reducescatter_async")
alltoall = _public("alltoall")
alltoall_async = _public("alltoall_async")
barrier = _public("barrier")
join = _public("join")
poll = _public("poll")
synchronize = _public("synchronize")
# Process sets and the timeline.
add_process_set = _public("add_process_set")
remove_process_set = _public("remove_process_set")
start_timeline = _public("start_timeline")
stop_timeline = _public("stop_timeline")
# Training: hpctrain.torch.functions and hpctrain.torch.optimizer unless init chose Horovod.
broadcast_parameters = _public("broadcast_parameters")
broadcast_optimizer_state = _public("broadcast_optimizer_state")
DistributedOptimizer = _public("DistributedOptimizer")


def __getattr__(name):
    from .sync_batch_norm import SyncBatchNorm
    # Loaded on first use, as Horovod's scripts reach it (``hvd.mpi_ops``).

    if name == "SyncBatchNorm":
        return SyncBatchNorm
    if name == "mpi_ops":
        import importlib

        return importlib.import_module(".mpi_ops", __name__)
    raise AttributeError(f"module 'hpctrain.torch' has no attribute {name!r}")


__all__ = [
    # collectives
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "sparse_allreduce_async", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "allgather_object", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "broadcast_object", "reducescatter",
    "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async", "alltoall",
    "alltoall_async", "barrier", "join", "poll", "synchronize",
    # ops, process sets, timeline, compression
    "Adasum", "Average", "Max", "Min", "Product", "Sum", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "start_timeline", "stop_timeline", "Compression",
    # training
    "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
    "SyncBatchNorm", "elastic", "HorovodInternalError", "HostsUpdatedInterrupt",
    # the world
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported",
    # what was built
    "mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled", "nccl_built", "ddl_built",
    "ccl_built", "cuda_built", "rocm_built",
    # hpctrain's own
    "algorithm", "comm_hook", "init_process_group",
]
