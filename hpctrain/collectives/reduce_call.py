"""reduce: every rank's vector reduced into the root's, algorithm by name. Its interface,
the class its algorithms subclass (``@interface``: its registry, its default algorithm and
its ``hpctrain bench`` plug-in), then its call.

    from hpctrain.collectives import reduce
    reduce(grad, total, op="sum", root=0, algo="tree")   # the sum, on rank 0 only

Its algorithms (``REGISTRIES["reduce"]``): ``tree``, ``mpi``, each a module
``reduce_<name>.py``. It takes ``DTYPES`` and ``OPS``; its messages move on the
communicator context's private duplicate (:mod:`.contexts`). Argument checks:
:mod:`.arguments`. The benchmark: ``size`` is the whole input, to ``--root``; ``busbw =
algbw`` (nccl-tests' factor 1: every rank but the root sends on the whole vector).

The reduction kernels are :mod:`.reduce`'s (imported by that module's path: the package's
name ``reduce`` is this collective).
"""

from functools import partial

from ..errors import UsageError
from .algorithm import Algorithm, Reduction
from .arguments import expect_length, rank_of, same_type_and_place
from .bench_plugin import SIZE_WHOLE, BenchCommand, BenchPlugin
from .buffers import execute, flatten
from .contexts import context, shape
from .dtypes import OPS, choices
from .kernels import averager, device_reducer, host_reducer
from .registry import interface, lookup


def _rooted_result(per, rank, args, data):
    """reduce's ``recv``: the reduced vector on the root; elsewhere the zeros it was made
    with, untouched."""
    return data.reduced(per, args.op) if rank == args.root else data.zeros(per)


@interface
class ReduceAlgorithm(Algorithm):
    """One reduce algorithm (registry ``REGISTRIES["reduce"]``).

    ``run(comm, send, recv, root, reduction)`` over the private communicator ``comm``:
    ``send`` is every rank's flat transport vector, of one length on every rank (at least
    one element), which the algorithm may overwrite except on the root; on rank ``root``,
    ``recv`` (as long as ``send``, not overlapping it) gets ``send`` reduced over every
    rank with ``reduction.reduce``; on the other ranks ``recv`` is ``None``. It is called
    with the same length and ``root`` on every rank.
    """

    collective = "reduce"
    default = "tree"
    # Every rank has a recv, as in nccl-tests; off the root it must come back untouched.
    bench = BenchPlugin(
        BenchCommand("every rank's vector reduced into root's", SIZE_WHOLE, op=True,
                     root="the rank that receives the result"),
        sizes=lambda per, p: (per, per),
        call=lambda algo, send, recv, counts, args, comm: partial(
            reduce, send, recv, args.op, args.root, algo, comm),
        inputs=lambda per, rank, p, data: data.blocks(per, [rank]),
        result=lambda per, rank, p, args, data: _rooted_result(per, rank, args, data),
        bus_line="# busbw = algbw (factor 1, as nccl-tests' reduce); size: the whole "
                 "vector, to root {root}",
        blocks=False)

    def workspace(self, size, rank, count, root):
        """Elements of receive workspace :meth:`run` needs (``reduction.scratch``)."""
        return 0

    def run(self, comm, send, recv, root, reduction):
        """Reduce every rank's ``send`` into the root's ``recv``."""
        raise NotImplementedError


def reduce(send, recv, op="sum", root=0, algo=ReduceAlgorithm.default, comm=None):
    """Reduce ``send`` over every rank with ``op`` into ``recv`` on rank ``root``; return
    ``recv`` (on every rank: on the others, whatever they passed, untouched).

    ``send``: a contiguous NumPy array or torch tensor (its flattened elements) of the same
    length on every rank, dtype one of ``DTYPES``; off the root it is used as workspace and
    may be overwritten (the tree reduces into it), on the root it is only read (a read-only
    array is fine there). ``recv``: on the root, as many elements as ``send``, of the same
    dtype, in the same place, not overlapping it; on every other rank it is neither read,
    written nor checked: pass ``None``. ``op``: ``sum``, ``avg`` (floor division for
    integers, as allreduce), ``min``, ``max`` or ``prod``. ``root``: a rank of ``comm``.
    ``algo``: ``tree`` or ``mpi``; ``comm``: an mpi4py intracommunicator, default
    ``COMM_WORLD``.

    Synchronisation point: a collective. Every rank of ``comm`` must call it, in the same
    order as its other collectives on ``comm``, with the same length, dtype, ``op``,
    ``root`` and ``algo``; a call that breaks this may hang or return garbage.
    """
    size, rank = shape(comm)
    algorithm = lookup("reduce", algo)
    if op not in OPS:
        raise UsageError(f"unknown reduce op {op!r}; valid choices: {choices(OPS)}")
    root = rank_of("reduce", root, size)
    send_flat, dtype, device = flatten(send, "reduce", writes=rank != root)
    count = send_flat.shape[0]
    recv_flat = None if rank != root else root_buffer(recv, root, count, dtype, device)
    if count == 0:
        return recv     # the same length on every rank: every rank returns here
    reduce_op = "sum" if op == "avg" else op
    ctx = context(comm)   # collective on first use: after the arguments are checked

    def bind(on_device):
        place = device if on_device else None
        kernel = device_reducer(dtype, reduce_op, device) if on_device \
            else host_reducer(dtype, reduce_op, count)
        scratch = ctx.scratch(dtype, algorithm.workspace(size, rank, count, root), place)
        reduction = Reduction(dtype, reduce_op, kernel, scratch)
        finish = averager(dtype, size, on_device) if op == "avg" else None

        def run(s, r=None):
            algorithm.run(ctx.comm, s, r, root, reduction)
            if finish is not None and r is not None:
                finish(r)
        return run
    # Staged through host memory, only the root copies a result back.
    outputs = () if recv_flat is None else (recv_flat,)
    execute(ctx, algorithm, dtype, device, (send_flat,), outputs, bind)
    return recv


def root_buffer(recv, root, count, dtype, device):
    """The root's ``recv`` as a flat transport view, after checking it can take the result
    of ``count`` elements of ``dtype`` in ``device``'s place."""
    if recv is None:
        raise UsageError(f"reduce: recv is None on the root (rank {root}): pass a recv "
                         f"buffer of {count} elements there (off the root, None is fine)")
    recv_flat, recv_dtype, recv_device = flatten(recv, "reduce")
    same_type_and_place("reduce", (dtype.name, device), (recv_dtype.name, recv_device))
    expect_length("reduce", "recv", recv, count, "the length of send (every rank's vector)")
    return recv_flat
