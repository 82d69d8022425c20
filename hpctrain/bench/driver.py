"""``hpctrain bench allgather|reducescatter|alltoall|broadcast|reduce``: one plug-in of
:data:`.blocks.PLUGINS`, timed and checked on the allreduce benchmark's pieces.

For each size every algorithm is timed on the same buffers in the same run
(:func:`.allreduce.time_calls`), one row each; then, in a separate pass, each algorithm
runs once on the plug-in's exact input and every element of ``recv`` is compared with the
plug-in's exact result (:class:`Exact`). The footer counts the wrong values of all ranks,
and a run with any exits non-zero: a benchmark that is also a test.
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
from .blocks import PLUGINS
from .sizes import format_size, size_range


@dataclass(frozen=True)
class Exact:
    """The correctness pass's data, handed to a plug-in's ``inputs`` and ``result``: tensors
    of ``dtype`` on ``device`` holding integers in [-3, 3] (:func:`.allreduce.check_input`),
    whose sums and products over ``ranks`` ranks are exact in every dtype and order."""

    dtype: object
    device: object
    ranks: int

    def blocks(self, per, seeds):
        """The input of ``per`` elements of each of ``seeds``, one after the other."""
        return torch.cat([check_input(per, seed, self.dtype, self.device) for seed in seeds])

    def reduced(self, count, op):
        """``blocks(count, [r])`` of every rank ``r`` reduced with ``op``, exactly."""
        return expected(count, self.ranks, op, self.dtype).to(self.device)

    def zeros(self, count):
        """``count`` zeros: a buffer as :func:`buffers` makes it."""
        return torch.zeros(count, dtype=self.dtype, device=self.device)


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
        send, recv = buffers(plugin, per, comm.size, dtype, device)
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


def buffers(plugin, per, ranks, dtype, device):
    """``plugin``'s ``(send, recv)`` for blocks of ``per`` elements, zeros (in place: one
    buffer, twice)."""
    send_count, recv_count = plugin.sizes(per, ranks)
    send = torch.zeros(send_count, dtype=dtype, device=device)
    if recv_count is None:
        return send, send
    return send, torch.zeros(recv_count, dtype=dtype, device=device)


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
    send, recv = buffers(plugin, per, comm.size, dtype, device)
    send.copy_(plugin.inputs(per, comm.rank, comm.size, Exact(dtype, device, comm.size)))
    plugin.call(algo, send, recv, [per] * comm.size, args, comm)()
    _sync(recv)
    if recv.numel() and faults.selected("bench.corrupt", comm.rank):
        recv[0] += 1  # proves that a wrong value is counted and fails the run
    got = recv.cpu().to(torch.float64)
    want = plugin.result(per, comm.rank, comm.size, args, Exact(dtype, "cpu", comm.size))
    want = want.to(torch.float64)
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
