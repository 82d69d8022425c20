"""``hpctrain bench allgather|reducescatter|alltoall``: every algorithm side by side, as
nccl-tests times these collectives.

One plug-in per collective (:data:`PLUGINS`: its buffers, its call, its exact result) on
the allreduce benchmark's driver: the same ``#`` header, timing loop (warm-up, algorithms
taking turns in rotated rounds, :func:`.allreduce.time_calls`), columns, correctness pass,
footer and JSON/HDF5 outputs. The blocks are equal: ``count`` elements in all, ``count / p``
per rank (``count`` rounded down to a multiple of ``p``, as nccl-tests does).

``size`` is the whole vector's bytes: allgather's output, reduce-scatter's input,
alltoall's input on each rank. ``busbw = algbw * (p-1)/p`` for all three (nccl-tests'
factor): each rank receives the ``(p-1)/p`` of the vector that it does not hold.
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

    def buffers(self, per, ranks, dtype, device):
        """``(send, recv)`` for blocks of ``per`` elements on ``ranks`` ranks."""
        total = per * ranks
        sizes = {"allgather": (per, total), "reducescatter": (total, per),
                 "alltoall": (total, total)}[self.name]
        return tuple(torch.zeros(n, dtype=dtype, device=device) for n in sizes)

    def call(self, algo, send, recv, per, op, comm):
        """A call of ``algo`` on the buffers, with no arguments."""
        counts = [per] * comm.size
        if self.name == "allgather":
            return lambda: collectives.allgather(send, recv, counts, algo, comm)
        if self.name == "reducescatter":
            return lambda: collectives.reduce_scatter(send, recv, counts, op, algo, comm)
        return lambda: collectives.alltoall(send, counts, recv, counts, algo, comm)

    def inputs(self, per, rank, ranks, dtype, device):
        """This rank's correctness input (integers in [-3, 3])."""
        if self.name == "allgather":
            return check_input(per, rank, dtype, device)
        if self.name == "reducescatter":
            return check_input(per * ranks, rank, dtype, device)
        # alltoall: the block rank i sends rank j is check_input(per, i * p + j)
        return torch.cat([check_input(per, rank * ranks + j, dtype, device)
                          for j in range(ranks)])

    def result(self, per, rank, ranks, op, dtype):
        """What ``recv`` must hold on ``rank``, exactly."""
        if self.name == "allgather":
            return torch.cat([check_input(per, r, dtype) for r in range(ranks)])
        if self.name == "reducescatter":
            return expected(per * ranks, ranks, op, dtype)[rank * per:(rank + 1) * per]
        return torch.cat([check_input(per, i * ranks + rank, dtype) for i in range(ranks)])


#: The collectives ``bench`` times beside allreduce.
PLUGINS = {name: Plugin(name, name == "reducescatter")
           for name in ("allgather", "reducescatter", "alltoall")}


def run(collective, args, comm):
    """Run the benchmark of ``collective``; return the number of wrong values (all ranks)."""
    plugin = PLUGINS[collective]
    faults.inject("bench.start", comm.rank)
    with checks(comm):   # the first collective: bad options end every rank alike
        algos = validate_algos(collective, args)
    dtype = DTYPES[args.dtype]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    blocks = sorted({size // itemsize // comm.size
                     for size in size_range(args.minbytes, args.maxbytes, args.stepfactor)})
    device = rank_device(args.device, comm)   # collective: one GPU per node-local rank
    redop = args.op if plugin.reduces else "none"
    settings = {"ranks": comm.size, "algos": ",".join(algos), "type": args.dtype,
                "redop": redop, "sizes": f"{format_size(args.minbytes)}..."
                f"{format_size(args.maxbytes)} x{args.stepfactor}", "iters": args.iters,
                "warmup": args.warmup, "check": args.check, "device": args.device}
    _print(comm, *report.header_lines(collective, settings, comm))
    _print(comm, f"# busbw = algbw * (p-1)/p = algbw * {(comm.size - 1) / comm.size:.3f}; "
                 f"size: the whole vector ({_vector(collective)}), {comm.size} blocks of "
                 f"count/p elements", *_column_header())
    rows = []
    for per in blocks:
        send, recv = plugin.buffers(per, comm.size, dtype, device)
        calls = {algo: plugin.call(algo, send, recv, per, args.op, comm) for algo in algos}
        times = time_calls(calls, args, comm, send)
        for algo in algos:
            nbytes = per * comm.size * itemsize
            row = timing_row(nbytes, per * comm.size, args.dtype, redop, algo,
                             np.array(times[algo]), comm, (comm.size - 1) / comm.size)
            row["wrong"] = count_wrong(plugin, algo, per, args, comm, device) \
                if args.check else -1
            rows.append(row)
            _print(comm, format_row(row))
    wrong = sum(max(row["wrong"], 0) for row in rows)
    _print(comm, *footer_lines(rows, algos, wrong, args.check))
    if comm.rank == 0:
        _save(collective, args, settings, rows, wrong)
    return wrong


def validate_algos(collective, args):
    """The algorithms of ``collective`` to run, after checking every option (local)."""
    valid = collectives.available(collective)
    algos = args.algos.split(",") if args.algos else valid
    unknown = [name for name in algos if name not in valid]
    if unknown:
        raise UsageError(f"unknown {collective} algorithm(s) {', '.join(unknown)} in "
                         f"--algos; valid: {', '.join(valid)}")
    # The rest (-d, -o, -n, -w, --device) as bench allreduce checks it.
    validate(Namespace(**{**vars(args), "algos": "", "profile": None}))
    return algos


def count_wrong(plugin, algo, per, args, comm, device):
    """Elements that differ from the exact result after one call, summed over ranks."""
    from mpi4py import MPI

    dtype = DTYPES[args.dtype]
    send, recv = plugin.buffers(per, comm.size, dtype, device)
    send.copy_(plugin.inputs(per, comm.rank, comm.size, dtype, device))
    plugin.call(algo, send, recv, per, args.op, comm)()
    _sync(recv)
    if recv.numel() and faults.selected("bench.corrupt", comm.rank):
        recv[0] += 1  # proves that a wrong value is counted and fails the run
    got = recv.cpu().to(torch.float64)
    want = plugin.result(per, comm.rank, comm.size, args.op, dtype).to(torch.float64)
    if args.op == "avg" and plugin.reduces and recv.is_floating_point():
        # The only rounding is the division by p (sums of these inputs are exact).
        bad = int(((got - want).abs() > torch.finfo(dtype).eps * want.abs()).sum())
    else:
        bad = int((got != want).sum())
    return comm.allreduce(bad, op=MPI.SUM)


def _vector(collective):
    return {"allgather": "recv", "reducescatter": "send",
            "alltoall": "send, on each rank"}[collective]


def _save(collective, args, settings, rows, wrong):
    document = {"benchmark": collective, "settings": settings,
                "environment": report.environment(), "columns": list(COLUMNS),
                "rows": rows, "wrong": wrong}
    if args.json:
        report.write_json(args.json, document)
    if args.hdf5:
        report.write_hdf5(args.hdf5, collective, rows,
                          {"settings": settings, "environment": document["environment"]})
