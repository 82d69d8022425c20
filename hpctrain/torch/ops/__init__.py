"""hpctrain's own operations, in layers (a module imports only from the layers below it):

1. ``common``: what every operation shares: the ops, the argument checks, names and
   signatures, the scaling, ``start`` (a call's checks, giving a ``Call``) and ``submit``
   (the hand-over to the communication thread); below it only the world (``basics``), the
   engine and the process sets.
2. The operations, one module per family, each importing only ``common``: ``allreduce``,
   ``allgather`` (with the reduce-scatter of rows that is an allgather's gradient),
   ``broadcast``, ``reducescatter``, ``alltoall``, and ``control`` (barrier, join, process
   sets, the timeline). They hold the queued (``_async``) and in-place forms and the data
   phases that other modules reuse (``reduce_flat``, ``bcast_tensors``).
3. What is made of several families: ``autograd``, the differentiable forms (``allreduce``,
   ``allgather``, ``broadcast``, ``reducescatter``, ``alltoall`` and their ``grouped_``
   forms), whose gradients are operations of other families; ``sparse``, sparse allreduce
   (two allgathers).

The public names are re-exported by :mod:`hpctrain.torch`, whose functions hand every call
to these or to Horovod (:mod:`hpctrain.torch.backends`)."""

from .allgather import allgather_async, allgather_object, grouped_allgather_async
from .allreduce import allreduce_, allreduce_async, allreduce_async_, grouped_allreduce_, \
    grouped_allreduce_async, grouped_allreduce_async_, reduce_flat
from .alltoall import alltoall_async
from .autograd import allgather, allreduce, alltoall, broadcast, grouped_allgather, \
    grouped_allreduce, grouped_reducescatter, reducescatter
from .broadcast import bcast_tensors, broadcast_, broadcast_async, broadcast_async_, \
    broadcast_object
from .common import Adasum, Average, Max, Min, Product, Sum, caller_event, check_tensor, \
    object_call, poll, resolve_op, synchronize, unsupported, wait_event
from .control import add_process_set, barrier, join, remove_process_set, start_timeline, \
    stop_timeline
from .reducescatter import grouped_reducescatter_async, reducescatter_async
from .sparse import sparse_allreduce_async
from ..engine import HorovodInternalError

__all__ = [
    "Adasum", "Average", "HorovodInternalError", "Max", "Min", "Product", "Sum",
    "add_process_set", "allgather", "allgather_async", "allgather_object", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async",
    "barrier", "bcast_tensors", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "caller_event", "check_tensor",
    "grouped_allgather", "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
    "grouped_reducescatter_async", "join", "object_call", "poll", "reduce_flat",
    "reducescatter", "reducescatter_async", "remove_process_set", "resolve_op",
    "sparse_allreduce_async", "start_timeline", "stop_timeline", "synchronize", "unsupported",
    "wait_event",
]

#: What the package exports that is no operation: the ops (``Sum``, ...), the error, and what
#: the other modules of hpctrain.torch build on.
NOT_OPERATIONS = ("Adasum", "Average", "HorovodInternalError", "Max", "Min", "Product", "Sum",
                  "bcast_tensors", "caller_event", "check_tensor", "object_call",
                  "reduce_flat", "resolve_op", "unsupported", "wait_event")
#: The operations, in Horovod's names: every other name of ``__all__``, what
#: :mod:`hpctrain.torch`'s public functions hand to this package (or to Horovod) through
#: their backend (:mod:`hpctrain.torch.backends`).
OPERATIONS = tuple(name for name in __all__ if name not in NOT_OPERATIONS)
