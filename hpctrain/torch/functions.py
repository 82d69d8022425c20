"""Whole-model helpers on top of the collectives: parameters and optimizer state.

Each function is a collective over the ranks of the process set (default: every rank).
"""

import zlib

import torch

from .ops.broadcast import bcast_tensors, broadcast_object, set_root
from .ops.common import (check_tensor, describe_tensors, dtype_name, signature, start,
                         submit, synchronize)
from .process_sets import global_process_set


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


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrite every tensor of ``params`` with ``root_rank``'s, in place.

    ``params``: ``model.state_dict()`` (tensors go in sorted-name order, the same on every
    rank) or a list of ``(name, tensor)`` such as ``model.named_parameters()``.
    Synchronisation point: one operation, whose names, shapes and dtypes every rank must
    share (a difference fails on every rank), then one broadcast per tensor.
    """
    pairs = _named_tensors(params, "broadcast_parameters")
    tensors = [t for _, t in pairs]

    def check(pset):
        for t in tensors:
            check_tensor(t, "broadcast_parameters", reduced=False)
        return set_root(pset, root_rank, "broadcast_parameters")

    w, pset, name, root = start("broadcast_parameters", None, process_set, check)
    algo = w.algorithm_for("broadcast")
    layout = ";".join(f"{n}:{tuple(t.shape)}:{dtype_name(t)}" for n, t in pairs)
    # The layout's checksum, not every shape: a model's hundreds of tensors would not fit in
    # a negotiation's first gather.
    agreed = signature("broadcast_parameters",
                       extra=(len(pairs), zlib.crc32(layout.encode()), root_rank))

    def run(comm, infos):
        with torch.no_grad():
            bcast_tensors(comm, tensors, root, algo)
        return None, None

    synchronize(submit(w, pset, name, agreed,
                       describe_tensors(f"broadcast_parameters of {len(pairs)} tensors", name,
                                        tensors[:3], root_rank=root_rank), run))


def broadcast_optimizer_state(optimizer, root_rank, model=None,
                              process_set=global_process_set):
    """Give every rank ``root_rank``'s optimizer state (momentum buffers, steps, lr).

    Unlike Horovod, an optimizer with no state yet is not stepped with zero gradients to
    create one (that step would change the weights under weight decay): all ranks keep an
    empty state, which is already the same everywhere. As after Horovod's call, every
    parameter that requires a gradient and had none has a zero one. A collective.
    """
    from .basics import world

    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    w = world()
    if not optimizer.state_dict()["state"]:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
    state = broadcast_object(optimizer.state_dict() if w.rank == root_rank else None,
                             root_rank, "optimizer state", process_set)
    if w.rank != root_rank:
        optimizer.load_state_dict(state)
