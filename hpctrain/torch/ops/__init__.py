"""hpctrain's own operations, one module per family: ``allreduce``, ``allgather``,
``broadcast``, ``reducescatter``, ``alltoall``, ``control`` (barrier, join, process sets);
``common`` holds what they share. The public names are re-exported by
:mod:`hpctrain.torch`, which hands every call to these or to Horovod (see ``basics``)."""

from .allgather import allgather, allgather_async, allgather_object, grouped_allgather, \
    grouped_allgather_async
from .allreduce import allreduce, allreduce_, allreduce_async, allreduce_async_, \
    grouped_allreduce, grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_, \
    reduce_flat, sparse_allreduce_async
from .alltoall import alltoall, alltoall_async
from .broadcast import bcast_tensors, broadcast, broadcast_, broadcast_async, \
    broadcast_async_, broadcast_object, object_call
from .common import Adasum, Average, Max, Min, Product, Sum, caller_event, check_tensor, \
    poll, resolve_op, synchronize, unsupported, wait_event
from .control import add_process_set, barrier, join, remove_process_set, start_timeline, \
    stop_timeline
from .reducescatter import grouped_reducescatter, grouped_reducescatter_async, reducescatter, \
    reducescatter_async
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
