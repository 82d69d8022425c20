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

from .backends import DISPATCHED as _DISPATCHED
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
    Horovod's if ``init`` chose it."""
    @wraps(getattr(_NATIVE, name))
    def call(*args, **kwargs):
        return getattr(backend(), name)(*args, **kwargs)
    return call


for _name in _DISPATCHED:
    globals()[_name] = _public(_name)


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
    "Adasum", "Average", "Compression", "HorovodInternalError",
    "HostsUpdatedInterrupt", "Max", "Min", "ProcessSet", "Product", "Sum", "SyncBatchNorm",
    "algorithm", "ccl_built", "comm_hook",
    "cross_rank", "cross_size", "cuda_built", "ddl_built", "elastic", "gloo_built",
    "gloo_enabled", "global_process_set", "init", "init_process_group", "is_homogeneous",
    "is_initialized",
    "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "rank", "rocm_built", "shutdown", "size", *_DISPATCHED,
]
