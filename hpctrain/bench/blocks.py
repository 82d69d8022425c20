"""``hpctrain bench allgather|reducescatter|alltoall|broadcast``: every algorithm side by
side, as nccl-tests times these collectives.

One plug-in per collective (:data:`PLUGINS`: its buffers, its call, its exact result) on
the allreduce benchmark's driver: the same ``#`` header, timing loop (warm-up, algorithms
taking turns in rotated rounds, :func:`.allreduce.time_calls`), columns, correctness pass,
footer and JSON/HDF5 outputs. The blocks are equal: ``count`` elements in all, ``count / p``
per rank (``count`` rounded down to a multiple of ``p``, as nccl-tests does); broadcast
moves the whole ``count`` from ``--root``.

``size`` is the whole vector's bytes: allgather's output, reduce-scatter's input,
alltoall's input on each rank, broadcast's buffer. ``busbw = algbw * (p-1)/p`` for the
first three (nccl-tests' factor): each rank receives the ``(p-1)/p`` of the vector that it
does not hold; ``busbw = algbw`` for broadcast (nccl-tests' factor 1): every rank but the
root receives the whole vector.
"""

from argparse import Namespace
from dataclasses import dataclass

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
    """One collective for the benchmark: how to call it and what it must give."""

    name: str                 # the command and REGISTRIES name
    reduces: bool             # takes an op (-o)
    blocks: bool              # the vector is cut into p blocks (all but broadcast)

    def parts(self, ranks):
        """How many equal parts ``count`` is cut into (``per`` elements each)."""
        return ranks if self.blocks else 1

    def bus_factor(self, ranks):
        """nccl-tests' busbw / algbw: (p-1)/p, or 1 for broadcast."""
        return (ranks - 1) / ranks if self.blocks else 1.0

    def buffers(self, per, ranks, dtype, device):
        """``(send, recv)`` for blocks of ``per`` elements on ``ranks`` ranks (broadcast:
        one buffer of ``per``, twice)."""
        if not self.blocks:
            buf = torch.zeros(per, dtype=dtype, device=device)
            return buf, buf
        total = per * ranks
        sizes = {"allgather": (per, total), "reducescatter": (total, per),
                 "alltoall": (total, total)}[self.name]
        return tuple(torch.zeros(n, dtype=dtype, device=device) for n in sizes)

    def call(self, algo, send, recv, per, args, comm):
        """A call of ``algo`` on the buffers, with no arguments."""
        counts = [per] * comm.size
        if self.name == "allgather":
            return lambda: collectives.allgather(send, recv, counts, algo, comm)
        if self.name == "reducescatter":
            return lambda: collectives.reduce_scatter(send, recv, counts, args.op, algo, comm)
        if self.name == "broadcast":
            return lambda: collectives.broadcast(send, args.root, algo, comm)
        return lambda: collectives.alltoall(send, counts, recv, counts, algo, comm)

    def inputs(self, per, rank, ranks, dtype, device):
        """This rank's correctness input (integers in [-3, 3]; a different one per rank)."""
        if self.name in ("allgather", "broadcast"):
            return check_input(per, rank, dtype, device)
        if self.name == "reducescatter":
            return check_input(per * ranks, rank, dtype, device)
        # alltoall: the block rank i sends rank j is check_input(per, i * p + j)
        return torch.cat([check_input(per, rank * ranks + j, dtype, device)
                          for j in range(ranks)])

    def result(self, per, rank, ranks, args, dtype):
        """What ``recv`` must hold on ``rank``, exactly."""
        if self.name == "broadcast":
            return check_input(per, args.root, dtype)
        if self.name == "allgather":
            return torch.cat([check_input(per, r, dtype) for r in range(ranks)])
        if self.name == "reducescatter":
            return expected(per * ranks, ranks, args.op, dtype)[rank * per:(rank + 1) * per]
        return torch.cat([check_input(per, i * ranks + rank, dtype) for i in range(ranks)])


#: The collectives ``bench`` times beside allreduce.
PLUGINS = {name: Plugin(name, name == "reducescatter", name != "broadcast")
           for name in ("allgather", "reducescatter", "alltoall", "broadcast")}


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
    if not plugin.blocks:
        settings["root"] = args.root
    factor = plugin.bus_factor(comm.size)
    _print(comm, *report.header_lines(collective, settings, comm))
    _print(comm, _bus_line(collective, factor, comm.size, args), *_column_header())
    rows = []
    for per in blocks:
        send, recv = plugin.buffers(per, comm.size, dtype, device)
        calls = {algo: plugin.call(algo, send, recv, per, args, comm) for algo in algos}
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
    plugin.call(algo, send, recv, per, args, comm)()
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


def _bus_line(collective, factor, ranks, args):
    if collective == "broadcast":
        return (f"# busbw = algbw (factor 1, as nccl-tests' broadcast); size: the whole "
                f"vector, from root {args.root}")
    vector = {"allgather": "recv", "reducescatter": "send",
              "alltoall": "send, on each rank"}[collective]
    return (f"# busbw = algbw * (p-1)/p = algbw * {factor:.3f}; size: the whole vector "
            f"({vector}), {ranks} blocks of count/p elements")


def _save(collective, args, settings, rows, wrong):
    document = {"benchmark": collective, "settings": settings,
                "environment": report.environment(), "columns": list(COLUMNS),
                "rows": rows, "wrong": wrong}
    if args.json:
        report.write_json(args.json, document)
    if args.hdf5:
        report.write_hdf5(args.hdf5, collective, rows,
                          {"settings": settings, "environment": document["environment"]})
