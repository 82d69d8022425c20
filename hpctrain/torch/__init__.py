"""``hpctrain.torch``: Horovod's ``horovod.torch`` API, with the allreduce algorithm chosen.

A script written for Horovod runs with one changed line::

    import hpctrain.torch as hvd        # instead of: import horovod.torch as hvd

    hvd.init()                          # or hvd.init(allreduce="tree")
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

and is launched as before (``mpirun -np 4 python train.py``). The algorithm is the
``allreduce=`` argument of ``init``, else ``$HPCTRAIN_ALLREDUCE``, else ``ring``; any name
of ``hpctrain.collectives.available()``, and ``horovod`` hands every call to the real
Horovod. :func:`comm_hook` does the same for PyTorch DDP scripts.

Supported: ``init``, ``shutdown``, ``is_initialized``, ``rank``, ``size``, ``local_rank``,
``local_size``, ``cross_rank``, ``cross_size``; ``allreduce(_)(async(_))``,
``grouped_allreduce(_)(async(_))``, ``synchronize``, ``poll``; ``broadcast(_)(async(_))``,
``broadcast_parameters``, ``broadcast_optimizer_state``, ``broadcast_object``,
``allgather``, ``allgather_object``, ``barrier``; ``DistributedOptimizer``;
``Compression.none|fp16|bf16``; ops ``Average``, ``Sum``, ``Min``, ``Max``; ``*_built``.
Not supported, with an error that says what to use: ``Adasum``, ``Product``, process sets,
``alltoall``, ``reducescatter``, ``join``, sparse tensors.
"""

from .basics import (algorithm, cross_rank, cross_size, cuda_built, gloo_built, init,
                     is_initialized, local_rank, local_size, mpi_built,
                     mpi_threads_supported, nccl_built, rank, shutdown, size)
from .compression import Compression
from .ddp import comm_hook, init_process_group
from .functions import (allgather, allgather_object, broadcast_object,
                        broadcast_optimizer_state, broadcast_parameters)
from .ops import (Adasum, Average, HorovodInternalError, Max, Min, Product, Sum, allreduce,
                  allreduce_, allreduce_async, allreduce_async_, alltoall, barrier, broadcast,
                  broadcast_, broadcast_async, broadcast_async_, grouped_allreduce,
                  grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_, join,
                  poll, reducescatter, synchronize)
from .optimizer import DistributedOptimizer

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "HorovodInternalError", "Max",
    "Min", "Product", "Sum", "algorithm", "allgather", "allgather_object", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "barrier", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object",
    "broadcast_optimizer_state", "broadcast_parameters", "comm_hook", "cross_rank",
    "cross_size", "cuda_built", "gloo_built", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "init", "init_process_group",
    "is_initialized", "join", "local_rank", "local_size", "mpi_built",
    "mpi_threads_supported", "nccl_built", "poll", "rank", "reducescatter", "shutdown",
    "size", "synchronize",
]
