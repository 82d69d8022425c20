"""Whole-model helpers on top of the collectives: parameters, optimizer state, objects.

Each function is a collective over the communicator given to ``init``.
"""

import torch

from .basics import world
from .ops import agree, bcast_tensors, check_tensor, describe_call, run_on_thread, signature


def _named_tensors(params, function):
    """``[(name, tensor)]`` from a ``state_dict``-like mapping (sorted) or a list of pairs."""
    if isinstance(params, dict):
        return sorted(params.items())
    if isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        pairs = list(params)
        if all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
            return pairs
    raise ValueError(f"hpctrain.torch.{function}: invalid params of type {type(params)}: "
                     f"pass model.state_dict() or model.named_parameters()")


def broadcast_parameters(params, root_rank):
    """Overwrite every tensor of ``params`` with ``root_rank``'s, in place.

    ``params``: ``model.state_dict()`` (tensors go in sorted-name order, the same on every
    rank) or a list of ``(name, tensor)`` such as ``model.named_parameters()``.
    Synchronisation point: one agreement check on all names, shapes and dtypes, then one
    broadcast per tensor.
    """
    w = world()
    if w.hvd is not None:
        return w.hvd.broadcast_parameters(params, root_rank)
    pairs = _named_tensors(params, "broadcast_parameters")
    tensors = [t for _, t in pairs]
    for t in tensors:
        check_tensor(t, "broadcast_parameters")
    names = "\n".join(n for n, _ in pairs)
    mine = signature("broadcast_parameters", names, tensors, root_rank)
    describe = describe_call("broadcast_parameters", f"{len(pairs)} tensors", tensors[:3],
                             root_rank=root_rank)

    def job():
        agree(w, mine, describe)
        if not 0 <= root_rank < w.size:
            raise ValueError(f"root_rank {root_rank} is not a rank: use 0 to {w.size - 1}")
        bcast_tensors(w, tensors, root_rank)

    w.engine.submit(job).wait()


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """``root_rank``'s ``obj`` (any picklable object) on every rank. A collective."""
    w = world()
    if w.hvd is not None:
        return w.hvd.broadcast_object(obj, root_rank, name=name)
    return run_on_thread(w, lambda: w.comm.bcast(obj, root=root_rank),
                         f"broadcast_object {name or ''} {root_rank}")


def allgather_object(obj, name=None, process_set=None):
    """Every rank's ``obj``, as a list in rank order, on every rank. A collective."""
    w = world()
    if w.hvd is not None:
        return w.hvd.allgather_object(obj, name=name)
    return run_on_thread(w, lambda: w.comm.allgather(obj), f"allgather_object {name or ''}")


def allgather(tensor, name=None, process_set=None):
    """Every rank's ``tensor`` concatenated along dimension 0 (shapes may differ there)."""
    w = world()
    if w.hvd is not None:
        return w.hvd.allgather(tensor, name=name)
    check_tensor(tensor, "allgather")
    pieces = allgather_object(tensor.detach().cpu(), name)
    rest = {tuple(p.shape[1:]) for p in pieces} | {str(p.dtype) for p in pieces}
    if len(rest) != 2:
        raise ValueError(f"allgather needs the same dtype and trailing dimensions on every "
                         f"rank, got {[(tuple(p.shape), str(p.dtype)) for p in pieces]}")
    return torch.cat(pieces).to(tensor.device)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Give every rank ``root_rank``'s optimizer state (momentum buffers, steps, lr).

    Unlike Horovod, an optimizer with no state yet is not stepped with zero gradients to
    create one (that step would change the weights under weight decay): all ranks keep an
    empty state, which is already the same everywhere. A collective.
    """
    w = world()
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if w.hvd is not None:
        return w.hvd.broadcast_optimizer_state(optimizer, root_rank, model=model)
    state = broadcast_object(optimizer.state_dict() if w.rank == root_rank else None,
                             root_rank, "optimizer state")
    if w.rank != root_rank:
        optimizer.load_state_dict(state)
