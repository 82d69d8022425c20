"""``hpctrain bench allgather|reducescatter|alltoall|broadcast``: every algorithm side by
side, as nccl-tests times these collectives.

One plug-in per collective, an entry of :data:`PLUGINS` (its buffers, its call, its
correctness input and exact result, its busbw line), on the allreduce benchmark's driver:
the same ``#`` header, timing loop (warm-up, algorithms taking turns in rotated rounds,
:func:`.allreduce.time_calls`), columns, correctness pass, footer and JSON/HDF5 outputs. A
new collective is that entry and its command line in ``cli.COLLECTIVES`` (kept there so
that parsing the command line imports no torch).

The blocks are equal: ``count`` elements in all, ``count / p`` per rank (``count`` rounded
down to a multiple of ``p``, as nccl-tests does); broadcast moves the whole ``count`` from
``--root``.

``size`` is the whole vector's bytes: allgather's output, reduce-scatter's input,
alltoall's input on each rank, broadcast's buffer. ``busbw = algbw * (p-1)/p`` for the
first three (nccl-tests' factor): each rank receives the ``(p-1)/p`` of the vector that it
does not hold; ``busbw = algbw`` for broadcast (nccl-tests' factor 1): every rank but the
root receives the whole vector.
"""

from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from .. import collectives, faults
from ..devices import rank_device
from ..errors import UsageError
from ..runtime import checks
from . import report
from .allreduce import (COLUMNS, DTYPES, _column_header, _print, _sync, check_input,
                        expected, footer_lines, format_row, time_calls, timing_row, validate)
from .sizes import format_size, size_range


@dataclass(frozen=True)
class Plugin:
    """One collective for the shared driver: everything that differs from one to the next.

    The functions take ``per`` (one block's elements; broadcast: the whole vector's), the
    ``rank`` and the number of ranks ``p``:

    - ``sizes(per, p)``: the elements of ``(send, recv)``; ``recv`` ``None``: in place;
    - ``call(algo, send, recv, counts, args, comm)``: a call of no arguments (``counts``:
      ``per`` for each rank);
    - ``inputs(per, rank, p, dtype, device)``: this rank's ``send`` for the correctness
      pass (integers in [-3, 3], a different vector per rank);
    - ``result(per, rank, p, args, dtype)``: what ``recv`` must then hold, exactly.
    """

    sizes: Callable
    call: Callable
    inputs: Callable
    result: Callable
    bus_line: str             # "# busbw = ..." with {factor}, {ranks} and {root} to fill
    blocks: bool = True       # the vector is cut into p blocks (all but broadcast)
    reduces: bool = False     # takes an op (-o)
    rooted: bool = False      # takes a root (--root)

    def parts(self, ranks):
        """How many equal parts ``count`` is cut into (``per`` elements each)."""
        return ranks if self.blocks else 1

    def bus_factor(self, ranks):
        """nccl-tests' busbw / algbw: (p-1)/p, the share of the vector each rank receives,
        where the vector is cut into blocks; 1 where every rank receives all of it."""
        return (ranks - 1) / ranks if self.blocks else 1.0

    def buffers(self, per, ranks, dtype, device):
        """``(send, recv)``, zeros (in place: one buffer, twice)."""
        send_count, recv_count = self.sizes(per, ranks)
        send = torch.zeros(send_count, dtype=dtype, device=device)
        if recv_count is None:
            return send, send
        return send, torch.zeros(recv_count, dtype=dtype, device=device)


def _blocks_line(vector):
    return ("# busbw = algbw * (p-1)/p = algbw * {factor:.3f}; size: the whole vector "
            f"({vector}), {{ranks}} blocks of count/p elements")


def _blocks_of(per, seeds, dtype, device="cpu"):
    return torch.cat([check_input(per, seed, dtype, device) for seed in seeds])


#: The collectives ``bench`` times beside allreduce, by their command and REGISTRIES name;
#: a new one adds an entry here and its command line in ``cli.COLLECTIVES``.
PLUGINS = {
    "allgather": Plugin(
        sizes=lambda per, p: (per, per * p),
        call=lambda algo, send, recv, counts, args, comm: partial(
            collectives.allgather, send, recv, counts, algo, comm),
        inputs=lambda per, rank, p, dtype, device: check_input(per, rank, dtype, device),
        result=lambda per, rank, p, args, dtype: _blocks_of(per, range(p), dtype),
        bus_line=_blocks_line("recv")),
    "reducescatter": Plugin(
        sizes=lambda per, p: (per * p, per),
        call=lambda algo, send, recv, counts, args, comm: partial(
            collectives.reduce_scatter, send, recv, counts, args.op, algo, comm),
        inputs=lambda per, rank, p, dtype, device: check_input(per * p, rank, dtype, device),
        result=lambda per, rank, p, args, dtype:
            expected(per * p, p, args.op, dtype)[rank * per:(rank + 1) * per],
        bus_line=_blocks_line("send"), reduces=True),
    # The block rank i sends rank j is check_input(per, i * p + j).
    "alltoall": Plugin(
        sizes=lambda per, p: (per * p, per * p),
        call=lambda algo, send, recv, counts, args, comm: partial(
            collectives.alltoall, send, counts, recv, counts, algo, comm),
        inputs=lambda per, rank, p, dtype, device:
            _blocks_of(per, (rank * p + j for j in range(p)), dtype, device),
        result=lambda per, rank, p, args, dtype:
            _blocks_of(per, (i * p + rank for i in range(p)), dtype),
        bus_line=_blocks_line("send, on each rank")),
    "broadcast": Plugin(
        sizes=lambda per, p: (per, None),
        call=lambda algo, send, recv, counts, args, comm: partial(
            collectives.broadcast, send, args.root, algo, comm),
        inputs=lambda per, rank, p, dtype, device: check_input(per, rank, dtype, device),
        result=lambda per, rank, p, args, dtype: check_input(per, args.root, dtype),
        bus_line="# busbw = algbw (factor 1, as nccl-tests' broadcast); size: the whole "
                 "vector, from root {root}",
        blocks=False, rooted=True),
}


def run(collective, args, comm):
    """Run the benchmark of ``collective``; return the number of wrong values (all ranks)."""
    plugin = PLUGINS[collective]
    faults.inject("bench.start", comm.rank)
    with checks(comm):   # the first collective: bad options end every rank alike
        algos = validate_algos(collective, args, comm.size)
    dtype = DTYPES[args.dtype]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    parts = plugin.parts(comm.size)
    blocks = sorted({size // itemsize // parts
                     for size in size_range(args.minbytes, args.maxbytes, args.stepfactor)})
    device = rank_device(args.device, comm)   # collective: one GPU per node-local rank
    redop = args.op if plugin.reduces else "none"
    settings = {"ranks": comm.size, "algos": ",".join(algos), "type": args.dtype,
                "redop": redop, "sizes": f"{format_size(args.minbytes)}..."
                f"{format_size(args.maxbytes)} x{args.stepfactor}", "iters": args.iters,
                "warmup": args.warmup, "check": args.check, "device": args.device}
    if plugin.rooted:
        settings["root"] = args.root
    factor = plugin.bus_factor(comm.size)
    _print(comm, *report.header_lines(collective, settings, comm))
    bus_line = plugin.bus_line.format(factor=factor, ranks=comm.size,
                                      root=getattr(args, "root", None))
    _print(comm, bus_line, *_column_header())
    rows = []
    for per in blocks:
        counts = [per] * comm.size
        send, recv = plugin.buffers(per, comm.size, dtype, device)
        calls = {algo: plugin.call(algo, send, recv, counts, args, comm) for algo in algos}
        times = time_calls(calls, args, comm, send)
        for algo in algos:
            nbytes = per * parts * itemsize
            row = timing_row(nbytes, per * parts, args.dtype, redop, algo,
                             np.array(times[algo]), comm, factor)
            row["wrong"] = count_wrong(plugin, algo, per, args, comm, device) \
                if args.check else -1
            rows.append(row)
            _print(comm, format_row(row))
    wrong = sum(max(row["wrong"], 0) for row in rows)
    _print(comm, *footer_lines(rows, algos, wrong, args.check))
    if comm.rank == 0:
        _save(collective, args, settings, rows, wrong)
    return wrong


def validate_algos(collective, args, ranks):
    """The algorithms of ``collective`` to run on ``ranks`` ranks, after checking every
    option (local)."""
    valid = collectives.available(collective)
    algos = args.algos.split(",") if args.algos else valid
    unknown = [name for name in algos if name not in valid]
    if unknown:
        raise UsageError(f"unknown {collective} algorithm(s) {', '.join(unknown)} in "
                         f"--algos; valid: {', '.join(valid)}")
    root = getattr(args, "root", 0)
    if not 0 <= root < ranks:
        raise UsageError(f"--root {root} is not a rank: valid values are 0 to {ranks - 1}")
    # The rest (-d, -o, -n, -w, --device) as bench allreduce checks it.
    validate(Namespace(**{**vars(args), "algos": "", "profile": None}))
    return algos


def count_wrong(plugin, algo, per, args, comm, device):
    """Elements that differ from the exact result after one call, summed over ranks."""
    from mpi4py import MPI

    dtype = DTYPES[args.dtype]
    send, recv = plugin.buffers(per, comm.size, dtype, device)
    send.copy_(plugin.inputs(per, comm.rank, comm.size, dtype, device))
    plugin.call(algo, send, recv, [per] * comm.size, args, comm)()
    _sync(recv)
    if recv.numel() and faults.selected("bench.corrupt", comm.rank):
        recv[0] += 1  # proves that a wrong value is counted and fails the run
    got = recv.cpu().to(torch.float64)
    want = plugin.result(per, comm.rank, comm.size, args, dtype).to(torch.float64)
    if args.op == "avg" and plugin.reduces and recv.is_floating_point():
        # The only rounding is the division by p (sums of these inputs are exact).
        bad = int(((got - want).abs() > torch.finfo(dtype).eps * want.abs()).sum())
    else:
        bad = int((got != want).sum())
    return comm.allreduce(bad, op=MPI.SUM)


def _save(collective, args, settings, rows, wrong):
    document = {"benchmark": collective, "settings": settings,
                "environment": report.environment(), "columns": list(COLUMNS),
                "rows": rows, "wrong": wrong}
    if args.json:
        report.write_json(args.json, document)
    if args.hdf5:
        report.write_hdf5(args.hdf5, collective, rows,
                          {"settings": settings, "environment": document["environment"]})
