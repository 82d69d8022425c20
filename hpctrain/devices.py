"""Which device a rank computes on: the usual one-GPU-per-rank mapping by node-local rank."""


def node_local_rank(comm):
    """This rank's index among the ranks of ``comm`` on its node (collective over ``comm``)."""
    return _on_node(comm, lambda local: local.Get_rank())


def ranks_on_node(comm):
    """How many ranks of ``comm`` share this rank's node (collective over ``comm``)."""
    return _on_node(comm, lambda local: local.Get_size())


def _on_node(comm, ask):
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return ask(local)
    finally:
        local.Free()


def rank_device(kind, comm):
    """``cpu``, or ``cuda:(local rank % GPUs on the node)`` made the current CUDA device.

    Collective over ``comm`` for ``cuda`` (the node-local rank is found with a split); two
    ranks on a node with one GPU share it. The caller checks that CUDA is available.
    """
    import torch

    if kind == "cpu":
        return torch.device("cpu")
    device = torch.device("cuda", node_local_rank(comm) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device
