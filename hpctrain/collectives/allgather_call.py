"""allgather: every rank's block to every rank, algorithm by name. Its interface, the class
its algorithms subclass (``@interface``: its registry, its default algorithm and its
``hpctrain bench`` plug-in), then its call.

    from hpctrain.collectives import allgather
    allgather(shard, full, counts, algo="ring")   # block r of full = rank r's shard

Its algorithms (``REGISTRIES["allgather"]``): ``ring``, ``butterfly``, ``mpi``, each a module
``allgather_<name>.py``. It moves bytes, so it takes any dtype; its messages move on the
communicator context's private duplicate (:mod:`.contexts`). Counts and argument checks:
:mod:`.arguments`. The benchmark: ``size`` is ``recv``, the whole vector of ``p`` blocks;
``busbw = algbw * (p-1)/p`` (:mod:`.bench_plugin`).
"""

from functools import partial

from .algorithm import Algorithm
from .arguments import block_bounds, byte_views, expect_length
from .bench_plugin import SIZE_IN_BLOCKS, BenchCommand, BenchPlugin, blocks_bus_line
from .buffers import execute
from .contexts import context, shape
from .dtypes import BYTES
from .registry import interface, lookup


@interface
class AllgatherAlgorithm(Algorithm):
    """One allgather algorithm (registry ``REGISTRIES["allgather"]``).

    ``run(comm, send, recv, bounds)`` over the private communicator ``comm``: ``send`` and
    ``recv`` are flat ``uint8`` views (allgather moves bytes, whatever the dtype), in host
    memory or, where :meth:`device_capable` says so, on a CUDA device; rank ``r``'s block is
    ``send`` on rank ``r`` and lands at ``recv[bounds[r]:bounds[r + 1]]`` on every rank. It
    is called with the same ``bounds`` on every rank.
    """

    collective = "allgather"
    default = "ring"
    bench = BenchPlugin(
        BenchCommand("every rank's block to every rank", SIZE_IN_BLOCKS),
        sizes=lambda per, p: (per, per * p),
        call=lambda algo, send, recv, counts, args, comm: partial(
            allgather, send, recv, counts, algo, comm),
        inputs=lambda per, rank, p, data: data.blocks(per, [rank]),
        result=lambda per, rank, p, args, data: data.blocks(per, range(p)),
        bus_line=blocks_bus_line("recv"))

    def run(self, comm, send, recv, bounds):
        """Gather every rank's ``send`` into ``recv`` (see the class docstring)."""
        raise NotImplementedError


def allgather(send, recv, counts, algo=AllgatherAlgorithm.default, comm=None):
    """Gather every rank's ``send`` into ``recv`` on every rank; return ``recv``.

    ``send``: a contiguous NumPy array or torch tensor (its flattened elements) of
    ``counts[rank]`` elements, any dtype; ``recv``: ``sum(counts)`` elements of the same
    dtype, in the same place (host, or the same CUDA device). Rank ``r``'s block lands at
    element ``sum(counts[:r])``. ``algo``: ``ring``, ``butterfly`` or ``mpi``; ``comm``: an
    mpi4py intracommunicator, default ``COMM_WORLD``.

    Synchronisation point: a collective. Every rank of ``comm`` must call it, in the same
    order as its other collectives on ``comm``, with the same ``counts`` and ``algo``; a
    call that breaks this may hang or return garbage.
    """
    size, rank = shape(comm)
    algorithm = lookup("allgather", algo)
    bounds = block_bounds(counts, size, "allgather", "counts")
    (send_bytes, recv_bytes), itemsize, device = byte_views("allgather", send, recv)
    expect_length("allgather", "send", send, bounds[rank + 1] - bounds[rank],
                  f"counts[{rank}] (this rank's block)")
    expect_length("allgather", "recv", recv, bounds[-1], "sum(counts) (every block)")
    if bounds[-1] == 0:
        return recv    # the same counts on every rank: every rank returns here
    scaled = tuple(b * itemsize for b in bounds)
    ctx = context(comm)   # collective on first use: after the arguments are checked

    def bind(on_device):
        return lambda s, r: algorithm.run(ctx.comm, s, r, scaled)
    execute(ctx, algorithm, BYTES, device, (send_bytes,), (recv_bytes,), bind)
    return recv
