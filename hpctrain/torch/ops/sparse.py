"""Sparse allreduce (``sparse_allreduce_async``), made of two allgathers as in Horovod: every
rank's indices and values are gathered and summed into one coalesced tensor. Above
:mod:`.allgather`, beside :mod:`.autograd`."""

import torch

from .allgather import allgather_async
from .common import Average, Sum, synchronize
from ..process_sets import global_process_set


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Queue the reduction of a sparse COO ``tensor`` (Horovod's allgather-based method):
    every rank's indices and values are gathered and summed into one coalesced tensor,
    divided by the number of ranks for ``Average``. Returns a handle whose
    :func:`synchronize` gives the sparse result."""
    if op not in (Average, Sum):
        raise ValueError("sparse allreduce takes op=hvd.Average or hvd.Sum")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError("sparse_allreduce_async takes a sparse COO tensor")
    t = tensor.coalesce()
    indices = t.indices().t().contiguous()
    values = t.values().contiguous()
    handles = (allgather_async(indices, f"{name}.indices", process_set),
               allgather_async(values, f"{name}.values", process_set))
    return _SparseHandle(handles, tensor, op, process_set)


class _SparseHandle:
    """Two allgathers (indices, values) that :func:`synchronize`, or calling the handle as
    Horovod's, turns into the sum."""

    def __init__(self, handles, tensor, op, process_set):
        self.handles, self.tensor, self.op, self.process_set = handles, tensor, op, process_set
        self.done = _Both(handles)

    def __call__(self):
        """The reduced sparse tensor (Horovod's handle is this function)."""
        return self.wait()[0]

    def wait(self):
        """Wait for both allgathers; ``(sparse result, None)``."""
        indices, values = (synchronize(h) for h in self.handles)
        if self.op == Average:
            values = values / self.process_set.size()
        result = torch.sparse_coo_tensor(indices.t(), values, self.tensor.shape,
                                         check_invariants=False).coalesce()
        return result, None


class _Both:
    def __init__(self, handles):
        self.handles = handles

    def is_set(self):
        return all(h.done.is_set() for h in self.handles)
