"""Horovod's allreduce (``hvd.allreduce``), the other baseline, and the one place where
hpctrain starts and stops Horovod (:func:`start`, :func:`shutdown`): this algorithm and the
``horovod`` backend of :mod:`hpctrain.torch` (:class:`hpctrain.torch.backends.HorovodBackend`)
share one started Horovod.

Horovod is imported, and ``hvd.init()`` called over the same ranks, on first use, so that
hpctrain works where Horovod is not built. Each call goes through Horovod's background
thread, which batches requests every cycle (``HOROVOD_CYCLE_TIME``, 1 ms by default): small
messages pay about a millisecond, which is what the Python algorithms should beat.

``sum``, ``avg``, ``min``, ``max`` and ``prod`` map to ``hvd.Sum``, ``hvd.Average``,
``hvd.Min``, ``hvd.Max`` and ``hvd.Product``, except ``avg`` of integers, which is
``hvd.Sum`` followed by our floor division (Horovod would truncate). Horovod's CPU build
has no bfloat16: a bfloat16 buffer is reduced as float32 in a reused buffer and rounded
back once, so it is slightly more accurate than the other algorithms' bfloat16.
"""

import numpy as np

from .algorithm import Algorithm
from .registry import register
from ..errors import UsageError
from ..gpu_checks import check_horovod_cuda

_UPCAST = {}           # device -> reused float32 buffer for bfloat16


class _Started:
    """``horovod.torch`` once :func:`start` has given it (``None`` before, and
    after :func:`shutdown`), and whether it was this module that called ``hvd.init``."""

    def __init__(self):
        self.hvd = None
        self.ours = False


_STARTED = _Started()


def start(comm):
    """``horovod.torch``, initialised (``hvd.init``) over the ranks of ``comm`` if needed;
    ``UsageError`` if Horovod is not importable, or runs already over other ranks.

    Synchronisation point on first use: ``hvd.init`` is collective.
    """
    if _STARTED.hvd is not None:
        return _STARTED.hvd
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise UsageError(f"allreduce algorithm 'horovod' needs Horovod with PyTorch support "
                         f"(pip install hpctrain[horovod]): {exc}") from None
    ours = not hvd.is_initialized()
    if ours:
        hvd.init(comm=comm)
    if (hvd.size(), hvd.rank()) != (comm.Get_size(), comm.Get_rank()):
        raise UsageError(f"Horovod was initialised over {hvd.size()} ranks (this one is "
                         f"{hvd.rank()}), but allreduce was asked to use {comm.Get_size()} "
                         f"(this one is {comm.Get_rank()}): use the communicator Horovod runs "
                         f"on")
    _STARTED.hvd, _STARTED.ours = hvd, ours
    return hvd


def shutdown():
    """Stop Horovod if :func:`start` initialised it (not if the script had); the next
    :func:`start` starts it again.

    Once started, Horovod's background thread negotiates with every other rank each cycle
    (1 ms), busy-polling MPI even when idle: on a machine with as many ranks as cores it
    takes the cores the other algorithms' large messages need (4 MiB allreduces here run
    several times slower). Benchmarks should time Horovod last and then call this.
    Synchronisation point: ``hvd.shutdown`` is collective.
    """
    if _STARTED.hvd is not None and _STARTED.ours:
        _STARTED.hvd.shutdown()
    _STARTED.hvd, _STARTED.ours = None, False


@register
class HorovodAllreduce(Algorithm):
    """``hvd.allreduce`` on a torch view of the buffer; the result is copied back."""

    name = "horovod"
    # Horovod runs through its own thread and path, not through ``allreduce``'s.
    chosen_by_auto = False
    moves_device_memory = True

    def averages(self, dtype):
        return not dtype.integer

    def device_capable(self, dtype, cuda_aware):
        return True   # Horovod moves device memory itself (NCCL or MPI)

    def run(self, comm, flat, plan):
        import torch

        if _STARTED.hvd is None and not isinstance(flat, np.ndarray) and flat.is_cuda:
            # Before hvd.init: a Horovod that cannot reduce device memory here (built without
            # CUDA, NCCL with ranks sharing a GPU) otherwise fails in C++ with a traceback
            # or in NCCL's set-up. Collective: every rank reaches this first call.
            check_horovod_cuda(comm, "allreduce algo='horovod' on CUDA tensors")
        hvd = start(comm)
        view = (torch.from_numpy(flat) if isinstance(flat, np.ndarray) else flat)
        view = view.view(plan.dtype.torch)
        op = {"sum": hvd.Sum, "avg": hvd.Average, "min": hvd.Min, "max": hvd.Max,
              "prod": hvd.Product}[plan.op]
        if plan.finish is not None:
            op = hvd.Sum    # integer average: we divide (floor) afterwards
        if plan.dtype.name == "bfloat16":
            work = _upcast(view)
            view.copy_(hvd.allreduce(work, op=op))
        else:
            view.copy_(hvd.allreduce(view, op=op))


def _upcast(tensor):
    import torch

    buffer = _UPCAST.get(tensor.device)
    if buffer is None or buffer.shape[0] < tensor.shape[0]:
        buffer = _UPCAST[tensor.device] = torch.empty(tensor.shape[0], dtype=torch.float32,
                                                      device=tensor.device)
    work = buffer[:tensor.shape[0]]
    work.copy_(tensor)
    return work
