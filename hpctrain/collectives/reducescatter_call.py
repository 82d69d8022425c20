"""reduce_scatter: every rank's vector reduced, each rank keeping its block, algorithm by
name. Its interface, the class its algorithms subclass (``@interface``: its registry, its
default algorithm and its ``hpctrain bench`` plug-in), then its call.

    from hpctrain.collectives import reduce_scatter
    reduce_scatter(grad, shard, counts, op="avg")   # shard = block r of the average

Its algorithms (``REGISTRIES["reducescatter"]``): ``ring``, ``butterfly``, ``mpi``, each a
module ``reducescatter_<name>.py``. It takes ``DTYPES`` and ``OPS``; its messages move on
the communicator context's private duplicate (:mod:`.contexts`). Counts and argument
checks: :mod:`.arguments`. The benchmark: ``size`` is ``send``, the whole vector of ``p``
blocks; ``busbw = algbw * (p-1)/p`` (:mod:`.bench_plugin`).
"""

from functools import partial

from ..errors import UsageError
from .algorithm import Algorithm, Reduction
from .arguments import block_bounds, expect_length, same_type_and_place
from .bench_plugin import SIZE_IN_BLOCKS, BenchCommand, BenchPlugin, blocks_bus_line
from .buffers import execute, flatten
from .contexts import context, shape
from .dtypes import OPS, choices
from .kernels import averager, device_reducer, host_reducer
from .registry import interface, lookup


@interface
class ReduceScatterAlgorithm(Algorithm):
    """One reduce-scatter algorithm (registry ``REGISTRIES["reducescatter"]``).

    ``run(comm, send, recv, bounds, reduction)`` over the private communicator ``comm``:
    ``send`` is every rank's whole flat transport vector (``bounds[-1]`` elements, which the
    algorithm may overwrite); ``recv`` gets block ``rank``,
    ``send[bounds[rank]:bounds[rank + 1]]`` reduced over every rank with
    ``reduction.reduce``. It is called with the same ``bounds`` on every rank.
    """

    collective = "reducescatter"
    default = "ring"
    bench = BenchPlugin(
        BenchCommand("reduce, each rank keeping its block", SIZE_IN_BLOCKS, op=True),
        sizes=lambda per, p: (per * p, per),
        call=lambda algo, send, recv, counts, args, comm: partial(
            reduce_scatter, send, recv, counts, args.op, algo, comm),
        inputs=lambda per, rank, p, data: data.blocks(per * p, [rank]),
        result=lambda per, rank, p, args, data:
            data.reduced(per * p, args.op)[rank * per:(rank + 1) * per],
        bus_line=blocks_bus_line("send"))

    def workspace(self, size, rank, bounds):
        """Elements of receive workspace :meth:`run` needs (``reduction.scratch``)."""
        return 0

    def run(self, comm, send, recv, bounds, reduction):
        """Reduce ``send`` over every rank, this rank's block into ``recv``."""
        raise NotImplementedError


def reduce_scatter(send, recv, counts, op="sum", algo=ReduceScatterAlgorithm.default,
                   comm=None):
    """Reduce ``send`` over every rank with ``op``; block ``rank`` of the result goes to
    ``recv``. Returns ``recv``.

    ``send``: a contiguous NumPy array or torch tensor of ``sum(counts)`` elements, dtype
    one of ``DTYPES``; it is used as workspace and may be overwritten. ``recv``:
    ``counts[rank]`` elements of the same dtype, in the same place. ``op``: ``sum``, ``avg``
    (floor division for integers, as allreduce), ``min``, ``max`` or ``prod``. ``algo``:
    ``ring``, ``butterfly`` or ``mpi``.

    Synchronisation point: a collective. Every rank of ``comm`` must call it, in the same
    order as its other collectives on ``comm``, with the same ``counts``, dtype, ``op`` and
    ``algo``; a call that breaks this may hang or return garbage.
    """
    size, rank = shape(comm)
    algorithm = lookup("reducescatter", algo)
    if op not in OPS:
        raise UsageError(f"unknown reduce_scatter op {op!r}; valid choices: {choices(OPS)}")
    bounds = block_bounds(counts, size, "reduce_scatter", "counts")
    send_flat, dtype, device = flatten(send, "reduce_scatter")
    recv_flat, recv_dtype, recv_device = flatten(recv, "reduce_scatter")
    same_type_and_place("reduce_scatter", (dtype.name, device), (recv_dtype.name, recv_device))
    expect_length("reduce_scatter", "send", send, bounds[-1], "sum(counts) (every block)")
    expect_length("reduce_scatter", "recv", recv, bounds[rank + 1] - bounds[rank],
                  f"counts[{rank}] (this rank's block)")
    if bounds[-1] == 0:
        return recv
    reduce_op = "sum" if op == "avg" else op
    ctx = context(comm)

    def bind(on_device):
        place = device if on_device else None
        reduce = device_reducer(dtype, reduce_op, device) if on_device \
            else host_reducer(dtype, reduce_op, bounds[-1])
        scratch = ctx.scratch(dtype, algorithm.workspace(ctx.size, ctx.rank, bounds), place)
        reduction = Reduction(dtype, reduce_op, reduce, scratch)
        finish = averager(dtype, ctx.size, on_device) if op == "avg" else None

        def run(s, r):
            algorithm.run(ctx.comm, s, r, bounds, reduction)
            if finish is not None:
                finish(r)
        return run
    execute(ctx, algorithm, dtype, device, (send_flat,), (recv_flat,), bind)
    return recv
