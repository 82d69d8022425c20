"""Keeping the model replicas identical: broadcast from rank 0, and a checksum to prove it.

Every function here is a collective over ``comm``, an mpi4py communicator: all ranks call
it, in the same order. :func:`start_from_root` is the one way every regime starts its
replicas; it needs no ``hpctrain.torch`` world, which only the allreduce regime has.
"""

import hashlib
import zlib

import torch

from ..runtime import agree_with_root, differ_from_root


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


def start_from_root(model, optimizer, comm, root=0):
    """Start every rank's replica from ``root``'s: its parameters and buffers, then its
    optimizer state (none when ``optimizer`` is None: the sharded regime hands out shards).

    Every rank first shows that it holds rank 0's layout (names, shapes, dtypes): a rank
    with another model would otherwise pair buffers of different sizes in the broadcasts
    (an MPI error on some ranks, a hang on the others); instead every rank raises the same
    ``Verdict``. A fresh optimizer's empty state is broadcast as it is: nothing steps to
    create one (as Horovod's ``broadcast_optimizer_state`` would, which changes Adam's step
    count and the weights under weight decay).

    Synchronisation points: one ``allgather`` of the layout, :func:`broadcast_model`, then
    one ``bcast`` of the optimizer's state.
    """
    tensors = sorted(model.state_dict().items())
    layout = ";".join(f"{name}:{tuple(t.shape)}:{t.dtype}" for name, t in tensors)
    agree_with_root(comm, (len(tensors), zlib.crc32(layout.encode())), lambda root: (
        f"a model other than rank 0's ({root[0]} tensors): do all ranks build the same "
        f"model?"))
    broadcast_model(model, comm, root)
    if optimizer is not None:
        broadcast_optimizer(optimizer, comm, root)


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
    sums, differ = differ_from_root(comm, checksum(model))
    if differ:
        # Not a Verdict: diverged replicas are a failure of the run (a fault, a bug), not
        # bad input, and end the job with their traceback.
        raise RuntimeError(f"model replicas differ {when}: ranks {differ} do not hold rank 0's "
                           f"weights (checksums {sums})")
    return sums[0]
