"""Where a rank runs: the ranks of its node (:func:`split_by_node`, the one node-local split
of the package), and the device it computes on, by node-local rank (one GPU per rank)."""


def split_by_node(comm, ranks_per_node=0):
    """A new communicator of the ranks of ``comm`` on this rank's node, in ``comm``'s rank
    order. Collective over ``comm``; the caller frees it.

    ``ranks_per_node = k > 0`` stands in for the shared-memory nodes: ranks
    ``[i·k, (i+1)·k)`` of ``comm`` form node ``i``, so that one machine can play several.
    """
    rank = comm.Get_rank()
    if ranks_per_node:
        return comm.Split(rank // ranks_per_node, key=rank)
    from mpi4py import MPI

    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)


def node_rank_and_size(comm):
    """``(rank, size)`` of this rank among the ranks of ``comm`` on its node (collective
    over ``comm``)."""
    local = split_by_node(comm)
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


def node_local_rank(comm):
    """This rank's index among the ranks of ``comm`` on its node (collective over ``comm``)."""
    return node_rank_and_size(comm)[0]


def ranks_on_node(comm):
    """How many ranks of ``comm`` share this rank's node (collective over ``comm``)."""
    return node_rank_and_size(comm)[1]


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


def synchronize(buf):
    """Wait until the work queued on ``buf``'s device is done (a CUDA tensor); nothing for
    a host tensor. A timer read after it counts the device's work, not only its queueing."""
    if buf.is_cuda:
        import torch

        torch.cuda.synchronize(buf.device)
