"""allgather, reduce_scatter, alltoall, broadcast and reduce: the collectives that move
per-rank blocks (or, broadcast and reduce, one vector from or to a root), algorithm by name.
Each is declared here in one place: its interface, the class its algorithms subclass
(``@interface``: its registry, its default algorithm, its companions and its ``hpctrain
bench`` plug-in), then its call.

    from hpctrain.collectives import (allgather, alltoall, broadcast, companion, reduce,
                                      reduce_scatter)
    allgather(shard, full, counts, algo="ring")            # block r of full = rank r's shard
    reduce_scatter(grad, shard, counts, op="avg")           # shard = block r of the average
    alltoall(send, sendcounts, recv, recvcounts)            # block j of rank i -> rank j
    broadcast(weights, root=0, algo="scatter_allgather")    # rank 0's weights everywhere
    reduce(grad, total, op="sum", root=0, algo="tree")      # the sum, on rank 0 only
    companion("allgather", "butterfly")                     # -> "butterfly"

``counts[r]`` is the number of elements of rank ``r``'s block; blocks lie side by side in
rank order, rank ``r``'s at ``sum(counts[:r])``. Counts may differ and may be 0.

Each algorithm is a module registered under its collective's interface (``REGISTRIES``):
allgather ``ring``, ``butterfly``, ``mpi``; reduce-scatter ``ring``, ``butterfly``, ``mpi``;
alltoall ``pairwise``, ``mpi``; broadcast ``tree``, ``scatter_allgather``, ``mpi``; reduce
``tree``, ``mpi``. Their messages move on the communicator context's private duplicate
(:mod:`.contexts`), each algorithm with tags of its own. allgather, alltoall and broadcast
move bytes, so they take any dtype; reduce_scatter and reduce take ``DTYPES`` and ``OPS``.
CUDA tensors go to a CUDA-aware MPI directly or through the context's pinned host buffer
(:func:`.buffers.stage`).

Unlike :func:`~.driver.allreduce`, these calls make no agreement check: the caller
negotiates sizes (``hpctrain.torch`` does). Arguments wrong on this rank raise a
``UsageError`` here, before any message is sent (even the first use of a communicator's
context, which duplicates it collectively, waits until the arguments are checked).

The bench plug-ins (``hpctrain bench allgather``, ...) cut ``count`` elements into equal
blocks, ``count / p`` per rank (``count`` rounded down to a multiple of ``p``, as
nccl-tests does); broadcast and reduce move the whole ``count`` from or to ``--root``.
``size`` is the whole vector's bytes: allgather's output, reduce-scatter's input,
alltoall's input on each rank, broadcast's buffer, reduce's input. ``busbw = algbw *
(p-1)/p`` for the first three (nccl-tests' factor): each rank receives the ``(p-1)/p`` of
the vector that it does not hold; ``busbw = algbw`` for broadcast and reduce (nccl-tests'
factor 1): every rank but the root receives (broadcast) or sends on (reduce) the whole
vector.
"""

import numbers
import operator
import sys
from functools import partial
from itertools import accumulate

from .algorithm import (INTERFACES, REGISTRIES, Algorithm, BenchCommand, BenchPlugin,
                        Reduction, interface)
from .buffers import flatten, flatten_bytes, stage
from .contexts import context, shape
from .dtypes import BYTES, OPS, choices
from .reduce import averager, device_reducer, host_reducer
from ..errors import UsageError

_BLOCKS = "size is the whole vector (p equal blocks); busbw = algbw*(p-1)/p"
_WHOLE = "size is the whole vector; busbw = algbw (nccl-tests' factor 1)"


def _blocks_line(vector):
    return ("# busbw = algbw * (p-1)/p = algbw * {factor:.3f}; size: the whole vector "
            f"({vector}), {{ranks}} blocks of count/p elements")


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
        BenchCommand("every rank's block to every rank", _BLOCKS),
        sizes=lambda per, p: (per, per * p),
        call=lambda algo, send, recv, counts, args, comm: partial(
            allgather, send, recv, counts, algo, comm),
        inputs=lambda per, rank, p, data: data.blocks(per, [rank]),
        result=lambda per, rank, p, args, data: data.blocks(per, range(p)),
        bus_line=_blocks_line("recv"))

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
        BenchCommand("reduce, each rank keeping its block", _BLOCKS, op=True),
        sizes=lambda per, p: (per * p, per),
        call=lambda algo, send, recv, counts, args, comm: partial(
            reduce_scatter, send, recv, counts, args.op, algo, comm),
        inputs=lambda per, rank, p, data: data.blocks(per * p, [rank]),
        result=lambda per, rank, p, args, data:
            data.reduced(per * p, args.op)[rank * per:(rank + 1) * per],
        bus_line=_blocks_line("send"))

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

    Synchronisation point: a collective, as :func:`allgather`, with the same ``counts``,
    dtype, ``op`` and ``algo`` on every rank.
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
        BenchCommand("block j of every rank to rank j", _BLOCKS),
        sizes=lambda per, p: (per * p, per * p),
        call=lambda algo, send, recv, counts, args, comm: partial(
            alltoall, send, counts, recv, counts, algo, comm),
        inputs=lambda per, rank, p, data: data.blocks(per, (rank * p + j for j in range(p))),
        result=lambda per, rank, p, args, data:
            data.blocks(per, (i * p + rank for i in range(p))),
        bus_line=_blocks_line("send, on each rank"))

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

    Synchronisation point: a collective, as :func:`allgather`, with matching counts and the
    same ``algo`` on every rank.
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
        BenchCommand("root's vector to every rank", _WHOLE, buffers="buffer",
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
        BenchCommand("every rank's vector reduced into root's", _WHOLE, op=True,
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

    Synchronisation point: a collective, as :func:`broadcast`, with the same length,
    dtype, ``op``, ``root`` and ``algo`` on every rank.
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


def companion(collective, allreduce_algo):
    """The algorithm of ``collective`` (``allgather``, ``reducescatter``, ``alltoall``,
    ``broadcast``, ``reduce`` or any other declared with ``@interface``) that goes with the
    allreduce algorithm ``allreduce_algo``: the one its interface's ``companions`` names,
    else the one of the same name where there is one (``ring``, ``butterfly``, ``mpi``;
    broadcast: ``tree``, ``mpi``, and ``scatter_allgather`` for ``ring`` and ``butterfly``;
    reduce: ``tree``, ``mpi``), else the interface's ``default`` (``ring``; ``pairwise`` for
    alltoall; ``tree`` for broadcast and reduce) — for ``ps``, ``ps-sharded``,
    ``hierarchical``, ``horovod``, ``auto`` and any other name."""
    declared = INTERFACES.get(collective)
    if declared is None:
        raise UsageError(f"companion: unknown collective {collective!r}; valid choices: "
                         f"{choices(INTERFACES)}")
    name = declared.companions.get(allreduce_algo, allreduce_algo)
    return name if name in REGISTRIES[collective] else declared.default


def lookup(collective, algo):
    """The registered ``collective`` algorithm named ``algo``; a ``UsageError`` naming the
    valid ones otherwise."""
    found = REGISTRIES[collective].get(algo)
    if found is None:
        raise UsageError(f"unknown {collective} algorithm {algo!r}; valid choices: "
                         f"{choices(REGISTRIES[collective])}")
    return found


def rank_of(what, root, size):
    """``root`` as an ``int`` if it is a rank of a communicator of ``size`` ranks; a
    ``UsageError`` giving the valid range otherwise."""
    if isinstance(root, bool) or not isinstance(root, numbers.Integral) \
            or not 0 <= root < size:
        raise UsageError(f"{what}: root={root!r} is not a rank of the communicator: "
                         f"valid values are 0 to {size - 1}")
    return int(root)


def block_bounds(counts, size, what, name):
    """The ``size + 1`` element offsets of the blocks of ``counts`` (one count per rank,
    integers >= 0); a ``UsageError`` saying what is wrong otherwise."""
    try:
        values = [operator.index(c) for c in counts]
    except TypeError:
        raise UsageError(f"{what}: {name} must be a sequence of {size} integers (one "
                         f"element count per rank), got {counts!r}") from None
    if len(values) != size:
        raise UsageError(f"{what}: {name} has {len(values)} entries, but the communicator "
                         f"has {size} ranks: give one element count per rank")
    negative = [i for i, c in enumerate(values) if c < 0]
    if negative:
        raise UsageError(f"{what}: {name}[{negative[0]}] = {values[negative[0]]} is "
                         f"negative: counts are numbers of elements, 0 or more")
    return (0, *accumulate(values))


def byte_views(what, send, recv):
    """``((send_bytes, recv_bytes), itemsize, device)``: both buffers as flat ``uint8``
    views, after checking they hold one dtype in one place."""
    send_bytes, send_type, send_device = flatten_bytes(send, what, writes=False)
    recv_bytes, recv_type, recv_device = flatten_bytes(recv, what, writes=True)
    same_type_and_place(what, (send_type, send_device), (recv_type, recv_device))
    return (send_bytes, recv_bytes), _itemsize(send), send_device


def same_type_and_place(what, send, recv):
    """A ``UsageError`` unless ``send`` and ``recv`` (``(dtype name, device)``) agree."""
    if send[0] != recv[0]:
        raise UsageError(f"{what}: send is {send[0]} but recv is {recv[0]}: both buffers "
                         f"must have the same dtype")
    if send[1] != recv[1]:
        raise UsageError(f"{what}: send is in {_place(send[1])} but recv is in "
                         f"{_place(recv[1])}: both buffers must be in the same place")


def expect_length(what, name, buf, count, meaning):
    """A ``UsageError`` unless ``buf`` has ``count`` elements."""
    have = _numel(buf)
    if have != count:
        raise UsageError(f"{what}: {name} has {have} elements, but {meaning} is {count}: "
                         f"pass a {name} buffer of {count} elements")


def execute(ctx, algorithm, dtype, device, inputs, outputs, bind):
    """Run ``bind(on_device)(*inputs, *outputs)`` where the data is: on the host, on the
    device (a CUDA-aware MPI and an algorithm that can), or through the pinned host buffer."""
    if device is None:
        bind(False)(*inputs, *outputs)
    elif algorithm.device_capable(dtype, ctx.cuda_aware):
        # MPI reads device memory directly: kernels that wrote it must be done.
        sys.modules["torch"].cuda.current_stream(device).synchronize()
        bind(True)(*inputs, *outputs)
    else:
        stage(ctx, dtype, inputs, outputs, bind(False))


def _numel(buf):
    return buf.size if hasattr(buf, "flags") else buf.numel()


def _itemsize(buf):
    return buf.itemsize if hasattr(buf, "flags") else buf.element_size()


def _place(device):
    return "host memory" if device is None else f"CUDA device {device}"
