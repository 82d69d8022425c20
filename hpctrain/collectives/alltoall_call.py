"""alltoall: block ``j`` of every rank to rank ``j``, algorithm by name. Its interface, the
class its algorithms subclass (``@interface``: its registry, its default algorithm and its
``hpctrain bench`` plug-in), then its call.

    from hpctrain.collectives import alltoall
    alltoall(send, sendcounts, recv, recvcounts)   # block j of rank i -> rank j

Its algorithms (``REGISTRIES["alltoall"]``): ``pairwise``, ``mpi``, each a module
``alltoall_<name>.py``. It moves bytes, so it takes any dtype; its messages move on the
communicator context's private duplicate (:mod:`.contexts`). Counts and argument checks:
:mod:`.arguments`. The benchmark: ``size`` is ``send`` on each rank, the whole vector of
``p`` blocks; ``busbw = algbw * (p-1)/p`` (:mod:`.bench_plugin`).
"""

from functools import partial

from ..errors import UsageError
from .algorithm import Algorithm
from .arguments import block_bounds, byte_views, expect_length
from .bench_plugin import SIZE_IN_BLOCKS, BenchCommand, BenchPlugin, blocks_bus_line
from .buffers import execute
from .contexts import context, shape
from .dtypes import BYTES
from .registry import interface, lookup


@interface
class AlltoallAlgorithm(Algorithm):
    """One alltoall algorithm (registry ``REGISTRIES["alltoall"]``).

    ``run(comm, send, send_bounds, recv, recv_bounds)`` over the private communicator
    ``comm``, on flat ``uint8`` views: ``send[send_bounds[j]:send_bounds[j + 1]]`` goes to
    rank ``j``, and what rank ``i`` sends this rank lands at
    ``recv[recv_bounds[i]:recv_bounds[i + 1]]``. The caller guarantees that the sizes of
    each pair's block agree on both ranks.
    """

    collective = "alltoall"
    default = "pairwise"
    # The block rank i sends rank j is data.blocks(per, [i * p + j]).
    bench = BenchPlugin(
        BenchCommand("block j of every rank to rank j", SIZE_IN_BLOCKS),
        sizes=lambda per, p: (per * p, per * p),
        call=lambda algo, send, recv, counts, args, comm: partial(
            alltoall, send, counts, recv, counts, algo, comm),
        inputs=lambda per, rank, p, data: data.blocks(per, (rank * p + j for j in range(p))),
        result=lambda per, rank, p, args, data:
            data.blocks(per, (i * p + rank for i in range(p))),
        bus_line=blocks_bus_line("send, on each rank"))

    def run(self, comm, send, send_bounds, recv, recv_bounds):
        """Send block ``j`` of ``send`` to rank ``j``; receive block ``i`` from rank ``i``."""
        raise NotImplementedError


def alltoall(send, sendcounts, recv, recvcounts, algo=AlltoallAlgorithm.default, comm=None):
    """Send block ``j`` of ``send`` to rank ``j``; receive rank ``i``'s block for this rank
    into block ``i`` of ``recv``. Returns ``recv``.

    ``send``: a contiguous NumPy array or torch tensor of ``sum(sendcounts)`` elements, any
    dtype, blocks in rank order; ``recv``: ``sum(recvcounts)`` elements of the same dtype,
    in the same place. ``recvcounts[i]`` on this rank must be ``sendcounts[rank]`` on rank
    ``i`` (only the block to itself can be checked here). ``algo``: ``pairwise`` or ``mpi``.

    Synchronisation point: a collective. Every rank of ``comm`` must call it, in the same
    order as its other collectives on ``comm``, with matching counts and the same ``algo``;
    a call that breaks this may hang or return garbage.
    """
    size, rank = shape(comm)
    algorithm = lookup("alltoall", algo)
    send_bounds = block_bounds(sendcounts, size, "alltoall", "sendcounts")
    recv_bounds = block_bounds(recvcounts, size, "alltoall", "recvcounts")
    mine = send_bounds[rank + 1] - send_bounds[rank]
    if recv_bounds[rank + 1] - recv_bounds[rank] != mine:
        raise UsageError(f"alltoall: sendcounts[{rank}] = {mine} but recvcounts[{rank}] = "
                         f"{recv_bounds[rank + 1] - recv_bounds[rank]} on rank {rank}: the "
                         f"block a rank sends itself must be the block it receives from itself")
    (send_bytes, recv_bytes), itemsize, device = byte_views("alltoall", send, recv)
    expect_length("alltoall", "send", send, send_bounds[-1], "sum(sendcounts)")
    expect_length("alltoall", "recv", recv, recv_bounds[-1], "sum(recvcounts)")
    scaled_send = tuple(b * itemsize for b in send_bounds)
    scaled_recv = tuple(b * itemsize for b in recv_bounds)
    ctx = context(comm)

    def bind(on_device):
        return lambda s, r: algorithm.run(ctx.comm, s, scaled_send, r, scaled_recv)
    execute(ctx, algorithm, BYTES, device, (send_bytes,), (recv_bytes,), bind)
    return recv
