"""Keeping the model replicas identical: broadcast from rank 0, and a checksum to prove it.

Every function here is a collective over ``comm``: all ranks call it, in the same order.
"""

import hashlib

import numpy as np
import torch


def broadcast_tensor(tensor, comm, root=0):
    """Overwrite ``tensor`` on every rank with ``root``'s (GPU tensors go through the host)."""
    if tensor.device.type == "cpu" and tensor.is_contiguous():
        comm.Bcast(tensor.detach().numpy(), root=root)
        return tensor
    staged = tensor.detach().cpu().contiguous()
    comm.Bcast(staged.numpy(), root=root)
    with torch.no_grad():
        tensor.copy_(staged)
    return tensor


def broadcast_model(model, comm, root=0):
    """Give every rank ``root``'s parameters and buffers.

    Tensors go in sorted-name order, the same on every rank, so that each ``Bcast`` meets
    its partner (a different order would pair tensors of different sizes: an MPI error or
    a hang).
    """
    for _, tensor in sorted(model.state_dict(keep_vars=True).items()):
        broadcast_tensor(tensor.data, comm, root)


def broadcast_optimizer(optimizer, comm, root=0):
    """Give every rank ``root``'s optimizer state (momentum buffers, step counts, lr)."""
    state = comm.bcast(optimizer.state_dict() if comm.Get_rank() == root else None, root=root)
    if comm.Get_rank() != root:
        optimizer.load_state_dict(state)


def checksum(model):
    """A 56-bit fingerprint of the model's parameters and buffers (bitwise)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return int.from_bytes(digest.digest()[:7], "little")


def check_identical(model, comm, when):
    """Raise ``RuntimeError`` on every rank unless all ranks hold bitwise-identical weights.

    Collective: every rank learns every checksum, so all of them raise or none does, and
    the message names the ranks that differ from rank 0.
    """
    sums = np.array(comm.allgather(checksum(model)))
    differ = np.flatnonzero(sums != sums[0]).tolist()
    if differ:
        raise RuntimeError(f"model replicas differ {when}: ranks {differ} do not hold rank 0's "
                           f"weights (checksums {sums.tolist()})")
    return int(sums[0])
