"""broadcast: the root's vector to every rank, algorithm by name. Its interface, the class
its algorithms subclass (``@interface``: its registry, its default algorithm, its companions
and its ``hpctrain bench`` plug-in), then its call.

    from hpctrain.collectives import broadcast
    broadcast(weights, root=0, algo="scatter_allgather")   # rank 0's weights everywhere

Its algorithms (``REGISTRIES["broadcast"]``): ``tree``, ``scatter_allgather``, ``mpi``, each
a module ``broadcast_<name>.py``. It moves bytes, so it takes any dtype; its messages move
on the communicator context's private duplicate (:mod:`.contexts`). Argument checks:
:mod:`.arguments`. The benchmark: ``size`` is the whole buffer, from ``--root``; ``busbw =
algbw`` (nccl-tests' factor 1: every rank but the root receives the whole vector).
"""

from functools import partial

from .algorithm import Algorithm
from .arguments import rank_of
from .bench_plugin import SIZE_WHOLE, BenchCommand, BenchPlugin
from .buffers import execute, flatten_bytes
from .contexts import context, shape
from .dtypes import BYTES
from .registry import interface, lookup


@interface
class BroadcastAlgorithm(Algorithm):
    """One broadcast algorithm (registry ``REGISTRIES["broadcast"]``).

    ``run(comm, buf, root)`` over the private communicator ``comm``: ``buf`` is a flat
    ``uint8`` view of the same number of bytes on every rank (broadcast moves bytes,
    whatever the dtype, at least one); rank ``root``'s bytes land in every rank's ``buf``.
    """

    collective = "broadcast"
    default = "tree"
    # The bandwidth-optimal allreduces go with the bandwidth-optimal broadcast.
    companions = {"ring": "scatter_allgather", "butterfly": "scatter_allgather"}
    bench = BenchPlugin(
        BenchCommand("root's vector to every rank", SIZE_WHOLE, buffers="buffer",
                     root="the rank whose vector is broadcast"),
        sizes=lambda per, p: (per, None),
        call=lambda algo, send, recv, counts, args, comm: partial(
            broadcast, send, args.root, algo, comm),
        inputs=lambda per, rank, p, data: data.blocks(per, [rank]),
        result=lambda per, rank, p, args, data: data.blocks(per, [args.root]),
        bus_line="# busbw = algbw (factor 1, as nccl-tests' broadcast); size: the whole "
                 "vector, from root {root}",
        blocks=False)

    def run(self, comm, buf, root):
        """Copy rank ``root``'s ``buf`` into every rank's ``buf``."""
        raise NotImplementedError


def broadcast(buf, root=0, algo=BroadcastAlgorithm.default, comm=None):
    """Copy rank ``root``'s ``buf`` into ``buf`` on every rank; return ``buf``.

    ``buf``: a contiguous NumPy array or torch tensor (its flattened elements), any dtype,
    host or CUDA, with the same number of bytes on every rank; it is only read on the root
    (which may pass a read-only array). ``root``: a rank of ``comm``. ``algo``: ``tree``,
    ``scatter_allgather`` or ``mpi``; ``comm``: an mpi4py intracommunicator, default
    ``COMM_WORLD``.

    Synchronisation point: a collective. Every rank of ``comm`` must call it, in the same
    order as its other collectives on ``comm``, with the same size, ``root`` and ``algo``;
    a call that breaks this may hang or return garbage.
    """
    size, rank = shape(comm)
    algorithm = lookup("broadcast", algo)
    root = rank_of("broadcast", root, size)
    flat, _, device = flatten_bytes(buf, "broadcast", writes=rank != root)
    if len(flat) == 0 or size == 1:
        return buf      # the same size on every rank: every rank returns here
    ctx = context(comm)   # collective on first use: after the arguments are checked

    def bind(on_device):
        return lambda b: algorithm.run(ctx.comm, b, root)
    # Staged through host memory, the root only copies its vector out and the others
    # only copy the result in.
    inputs, outputs = ((flat,), ()) if rank == root else ((), (flat,))
    execute(ctx, algorithm, BYTES, device, inputs, outputs, bind)
    return buf
