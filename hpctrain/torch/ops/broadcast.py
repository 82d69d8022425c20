"""Broadcast: ``broadcast_``, ``broadcast_async(_)``, ``broadcast_object``, and the data
phase others share (:func:`bcast_tensors`).

``root_rank`` is a world rank, which must belong to the process set. The differentiable
``broadcast`` is in :mod:`.autograd` (its gradient is an allreduce).
"""

import pickle

import torch

from .common import (check_tensor, describe_tensors, object_call, on_thread, signature,
                     start, submit, synchronize)
from ..process_sets import global_process_set


def bcast_tensors(comm, tensors, root, algo):
    """On the communication thread: set rank ``root``'s values into every tensor of
    ``tensors``, over ``comm``, with the broadcast algorithm ``algo``.

    Each tensor goes to :func:`hpctrain.collectives.broadcast` as it is (any dtype, no copy
    when contiguous), which moves CUDA tensors straight through a CUDA-aware MPI or through
    its pinned host buffer: device memory is never handed to a library that cannot read it.
    """
    from ... import collectives

    if comm.Get_size() == 1:
        return tensors
    for tensor in tensors:
        work = tensor.detach()
        if not work.is_contiguous():
            work = work.contiguous()
        collectives.broadcast(work, root, algo, comm)
        if work.data_ptr() != tensor.data_ptr():
            with torch.no_grad():
                tensor.copy_(work)
    return tensors


def set_root(pset, root_rank, function):
    """The set rank of world rank ``root_rank``; ``ValueError`` if it is not in the set."""
    if not isinstance(root_rank, int) or root_rank not in pset.ranks:
        raise ValueError(f"hpctrain.torch.{function}: root_rank {root_rank!r} is not a rank "
                         f"of the process set: use one of {pset.ranks}")
    return pset.ranks.index(root_rank)


def _broadcast_async(tensor, output, root_rank, name, process_set, function):
    def check(pset):
        check_tensor(tensor, function, reduced=False)
        return set_root(pset, root_rank, function)

    w, pset, name, root = start(function, name, process_set, check)
    algo = w.algorithm_for("broadcast")

    def work(comm, infos):
        target = tensor if output is None else output
        if output is not None and comm.Get_rank() == root:
            output.copy_(tensor.detach())
        return bcast_tensors(comm, [target], root, algo)[0]

    return submit(w, pset, name, signature("broadcast", [tensor], extra=(root_rank,)),
                  describe_tensors("broadcast", name, [tensor], root_rank=root_rank),
                  on_thread([tensor], work))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Queue a broadcast of ``root_rank``'s ``tensor`` into a new tensor; return a handle."""
    output = torch.empty_like(tensor) if isinstance(tensor, torch.Tensor) else None
    return _broadcast_async(tensor, output, root_rank, name, process_set, "broadcast_async")


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Queue an in-place broadcast of ``root_rank``'s ``tensor``; return a handle."""
    return _broadcast_async(tensor, None, root_rank, name, process_set, "broadcast_async_")


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrite ``tensor`` with ``root_rank``'s on every rank; return it. A collective."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """``root_rank``'s ``obj`` (any picklable object) on every rank of the set."""
    pset = global_process_set if process_set is None else process_set
    root = set_root(pset, root_rank, "broadcast_object")
    # Pickled here, before the operation, not by mpi4py inside it: a root whose object
    # cannot be pickled would fail alone in the data phase, with the other ranks waiting in
    # the broadcast for ever. Found here, it fails the call on every rank.
    blob = error = None
    if pset.rank() == root:
        try:
            blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - pickle raises many kinds
            error = exc

    def check(pset):
        if error is not None:
            raise ValueError(f"rank {root_rank}'s object cannot be broadcast: it does not "
                             f"pickle ({type(error).__name__}: {error})")

    return object_call("broadcast_object", name, process_set,
                       lambda comm: pickle.loads(comm.bcast(blob, root=root)), (root_rank,),
                       check)
