"""Alltoall: ``alltoall_async``.

Rank ``r`` cuts its tensor along dimension 0 into ``splits[0], splits[1], ...`` rows and
sends block ``s`` to set rank ``s``; it receives, in rank order, the blocks the others cut
for it. ``splits=None`` cuts into equal blocks (the rows must divide by the set's size).
Each rank's splits travel in the negotiation, so every rank knows what it receives before
any data moves. With ``splits`` given, the result is ``(tensor, received_splits)``. The
differentiable ``alltoall`` is in :mod:`.autograd`.
"""

import torch

from .common import (check_tensor, describe_tensors, on_thread, rows_moved, signature,
                     start, submit)
from ..process_sets import global_process_set


def _splits(tensor, splits, size, function):
    """The rows for each rank, as a list of ints; errors say what would be right."""
    rows = tensor.shape[0]
    if splits is None:
        if rows % size:
            raise ValueError(f"hpctrain.torch.{function}: dimension 0 ({rows} rows) does not "
                             f"divide by the {size} ranks; pass splits= (rows per rank)")
        return [rows // size] * size
    if isinstance(splits, torch.Tensor):
        if splits.dtype not in (torch.int32, torch.int64) or splits.dim() != 1:
            raise ValueError(f"hpctrain.torch.{function}: splits must be a 1-D int32 or int64 "
                            f"tensor (or a list of ints), got {splits.dtype} of shape "
                            f"{tuple(splits.shape)}")
        splits = splits.tolist()
    splits = list(splits)
    if not all(isinstance(s, int) for s in splits):
        raise ValueError(f"hpctrain.torch.{function}: splits must be integers, got {splits}")
    if len(splits) != size:
        raise ValueError(f"hpctrain.torch.{function}: splits has {len(splits)} entries; it "
                         f"needs one per rank of the set ({size})")
    if any(s < 0 for s in splits) or sum(splits) != rows:
        raise ValueError(f"hpctrain.torch.{function}: splits {splits} must be non-negative "
                         f"and add up to dimension 0 of the tensor ({rows})")
    return splits


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set,
                   function="alltoall_async"):
    """Queue an alltoall of ``tensor``; ``synchronize`` gives ``(output, received_splits)``."""
    def check(pset):
        check_tensor(tensor, function, reduced=False)
        if tensor.dim() == 0:
            raise ValueError(f"hpctrain.torch.{function} cuts dimension 0: a scalar has none")
        return _splits(tensor, splits, pset.size(), function)

    w, pset, name, sends = start(function, name, process_set, check)
    algo = w.algorithm_for("alltoall")
    # received_splits lives where the splits were given (a CUDA tensor's on its device, as
    # Horovod returns them); from a list, on the CPU.
    splits_device = splits.device if isinstance(splits, torch.Tensor) else torch.device("cpu")

    def work(comm, infos):
        from ... import collectives

        me = comm.Get_rank()
        received = [info[me] for info in infos]
        out = rows_moved(comm, tensor, received, lambda send, recv, width:
                         collectives.alltoall(send, [s * width for s in sends], recv,
                                              [r * width for r in received], algo=algo,
                                              comm=comm))
        return out, torch.tensor(received, dtype=torch.int32, device=splits_device)

    return submit(w, pset, name, signature("alltoall", [tensor], ragged=True),
                  describe_tensors("alltoall", name, [tensor]),
                  on_thread([tensor], work), info=sends)
