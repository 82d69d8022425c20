"""``hpctrain bench allreduce|allgather|reducescatter|alltoall|broadcast|reduce``: the one
driver, in the manner of nccl-tests, for every plug-in of :data:`.blocks.PLUGINS`.

For each size, every algorithm is timed on the same buffers in the same run, so ratios
between algorithms are meaningful even on a shared, noisy machine (absolute times are not).

Timing: ``-w`` warm-up calls, then ``-n`` timed calls split into rounds in which the
algorithms take turns (:func:`time_calls`); each rank's time is the mean over its timed
calls, and the table shows its min/avg/max over ranks. ``algbw`` is the size divided by the
*max* time (a collective is done when its last rank is); ``busbw`` is ``algbw`` times the
plug-in's factor, the traffic each rank's link carries in a bandwidth-optimal algorithm
(``2(p-1)/p`` for allreduce), comparable across rank counts and against a link's bandwidth.
The JSON and HDF5 outputs also hold ``time_median_us``, the slowest rank's median call,
which studies fit models to. The timed loop runs on zeros (stable values, no denormals).

Then, in a separate pass (``-c 1``), each algorithm runs once on the plug-in's exact input
and every element of its output is compared with the plug-in's exact result (:class:`Exact`:
small integers whose sums are exact in every dtype and order). The footer counts the wrong
values of all ranks, and a run with any exits non-zero: a benchmark that is also a test.

A Horovod algorithm is timed last, over all sizes, and then shut down: its background
thread, once started, polls MPI every cycle and slows whatever runs after it on shared
cores. What a plug-in does beyond this (allreduce's ``auto`` and Sendrecv reference) is its
``extras`` (:mod:`.extras`).
"""

import sys
from dataclasses import dataclass

import numpy as np
import torch

from .. import collectives, faults, gpu_checks
from ..devices import rank_device, synchronize
from ..errors import UsageError
from ..runtime import checks
from . import report
from .blocks import PLUGINS
from .extras import Extras
from .sizes import format_size, size_range

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64, "int32": torch.int32, "int64": torch.int64}
OPS = ("sum", "avg", "min", "max", "prod")
#: Timed rounds per size: the algorithms take turns, ROUNDS times, in rotated order.
ROUNDS = 4


@dataclass(frozen=True)
class Exact:
    """The correctness pass's data, handed to a plug-in's ``inputs`` and ``result``: tensors
    of ``dtype`` on ``device`` holding integers in [-3, 3] (:func:`check_input`), whose sums
    and products over ``ranks`` ranks are exact in every dtype and order."""

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
    """Run the benchmark of ``collective``; return the number of wrong values over all
    sizes, algorithms and ranks."""
    plugin = PLUGINS[collective]
    extras = (plugin.extras or Extras)()
    faults.inject("bench.start", comm.rank)
    with checks(comm):   # the first collective: bad options end every rank alike
        algos = validate(plugin, extras, collective, args, comm.size)
    device = rank_device(args.device, comm)   # collective: one GPU per node-local rank
    algos, left_out = horovod_on_device(algos, args, comm)     # collective with cuda
    settings = {**_settings(plugin, algos, args, comm.size), **extras.settings(args, comm, device)}
    factor = plugin.bus_factor(comm.size)
    _print(comm, *report.header_lines(collective, settings, comm))
    _print(comm, *([left_out] if left_out else []),
           plugin.bus_line.format(factor=factor, ranks=comm.size,
                                  root=getattr(args, "root", None)),
           *report.column_header())
    extras.begin(args, comm)
    rows = measure_all(plugin, extras, algos, args, comm, device)
    if "horovod" in algos:
        collectives.horovod.shutdown()
    before, after = extras.closing(rows, comm.size)
    wrong = sum(max(row["wrong"], 0) for row in rows)
    _print(comm, *before, *report.footer_lines(rows, algos, wrong, args.check), *after)
    if comm.rank == 0:
        _save(collective, args, settings, rows, wrong, extras.document())
    return wrong


def _settings(plugin, algos, args, ranks):
    settings = {"ranks": ranks, "algos": ",".join(algos), "type": args.dtype,
                "redop": args.op if plugin.reduces else "none",
                "sizes": f"{format_size(args.minbytes)}...{format_size(args.maxbytes)} "
                         f"x{args.stepfactor}", "iters": args.iters, "warmup": args.warmup,
                "check": args.check, "device": args.device}
    if plugin.rooted:
        settings["root"] = args.root
    return settings


def validate(plugin, extras, collective, args, ranks):
    """The algorithms to run on ``ranks`` ranks, after checking every option (local: no
    communication)."""
    algos = extras.algorithms(collective, args)
    root = getattr(args, "root", 0)
    if not 0 <= root < ranks:
        raise UsageError(f"--root {root} is not a rank: valid values are 0 to {ranks - 1}")
    if args.dtype not in DTYPES:
        raise UsageError(f"unknown type {args.dtype!r} (-d); valid: {', '.join(DTYPES)}")
    if args.op not in OPS:
        raise UsageError(f"unknown reduction {args.op!r} (-o); valid: {', '.join(OPS)}")
    if args.iters < 1 or args.warmup < 0:
        raise UsageError(f"need -n >= 1 and -w >= 0, got -n {args.iters} -w {args.warmup}")
    if args.device == "cuda":
        gpu_checks.check_cuda_visible("--device cuda")
    return algos


def horovod_on_device(algos, args, comm):
    """``algos`` without Horovod where it cannot reduce this run's CUDA buffers: an error
    when ``--algos`` named it, a footnote (returned) when it came from the default list.

    Synchronisation point for ``--device cuda`` with Horovod among ``algos``: every rank
    takes the same verdict (:func:`hpctrain.gpu_checks.horovod_cuda_verdict`)."""
    if args.device != "cuda" or "horovod" not in algos:
        return algos, None
    option = "--device cuda with --algos horovod"
    verdict = gpu_checks.horovod_cuda_verdict(comm, option)
    if verdict is None:
        return algos, None
    if args.algos:
        raise verdict
    return [a for a in algos if a != "horovod"], f"# horovod left out: {verdict.line()}"


def measure_all(plugin, extras, algos, args, comm, device):
    """Every row of the table, printed as it is measured: each size, all ``algos`` side by
    side; Horovod after the others, over all sizes."""
    itemsize = torch.empty(0, dtype=DTYPES[args.dtype]).element_size()
    parts = plugin.parts(comm.size)
    blocks = sorted({size // itemsize // parts
                     for size in size_range(args.minbytes, args.maxbytes, args.stepfactor)})
    first = [a for a in algos if a != "horovod"]
    last = [a for a in algos if a == "horovod"]
    rows = []
    for group in (first, last):
        if group is last and last and first:
            _print(comm, "# horovod: timed after the others (its background thread would "
                         "slow them), then shut down")
        for per in blocks if group else ():
            rows += measure(plugin, extras, group, per, args, comm, device,
                            group is first and per == blocks[0])
    return rows


def measure(plugin, extras, algos, per, args, comm, device, first):
    """The rows of ``algos`` at blocks of ``per`` elements (timed, then checked), and the
    extras' calls timed beside them (``first``: at the smallest size, before Horovod)."""
    dtype = DTYPES[args.dtype]
    send, recv = buffers(plugin, per, comm.size, dtype, device)
    counts = [per] * comm.size
    calls = {algo: plugin.call(algo, send, recv, counts, args, comm) for algo in algos}
    beside = extras.beside(send, comm, first)
    times = time_calls({**calls, **beside}, args, comm, send)
    parts, factor = plugin.parts(comm.size), plugin.bus_factor(comm.size)
    redop = args.op if plugin.reduces else "none"

    def row(name):
        return timing_row(per * parts * send.element_size(), per * parts, args.dtype, redop,
                          name, np.array(times[name]), comm, factor)
    for name in beside:
        extras.measured(name, row(name))
    rows = []
    for algo in algos:
        rows.append(row(algo))
        rows[-1]["wrong"] = count_wrong(plugin, algo, per, args, comm, device) \
            if args.check else -1
        _print(comm, report.format_row(rows[-1]))
    return rows


def buffers(plugin, per, ranks, dtype, device):
    """``plugin``'s ``(send, recv)`` for blocks of ``per`` elements, zeros (in place: one
    buffer, twice)."""
    send_count, recv_count = plugin.sizes(per, ranks)
    send = torch.zeros(send_count, dtype=dtype, device=device)
    if recv_count is None:
        return send, send
    return send, torch.zeros(recv_count, dtype=dtype, device=device)


def time_calls(calls, args, comm, buf):
    """``{name: [seconds of each timed call on this rank]}`` for ``calls`` (name -> a
    function of no arguments); ``buf``: a tensor whose device is synchronised around each
    timed loop.

    Every call first makes its ``-w`` warm-up calls. The timed calls are then split into up
    to ``ROUNDS`` rounds in which the calls take turns, in an order rotated each round: on
    a shared machine the load drifts within seconds, and a first algorithm timed in one
    block would meet other conditions than the last (10-25 % at 4 MiB here).

    Synchronisation point: every rank must time the same calls in the same order.
    """
    from mpi4py import MPI

    names = list(calls)
    for call in calls.values():
        for _ in range(args.warmup):
            call()
    rounds = min(ROUNDS, args.iters)
    times = {name: [] for name in names}     # this rank's duration of every timed call
    wtime = MPI.Wtime
    for r in range(rounds):
        iters = args.iters // rounds + (r < args.iters % rounds)
        for name in names[r % len(names):] + names[:r % len(names)]:
            call = calls[name]
            synchronize(buf)
            comm.Barrier()  # synchronisation point: every rank starts the timed loop together
            stamps = np.empty(iters + 1)
            faults.inject("bench.allreduce", comm.rank)
            stamps[0] = wtime()
            for i in range(iters):
                call()
                stamps[i + 1] = wtime()
            synchronize(buf)
            stamps[-1] = wtime()
            times[name].extend(np.diff(stamps))
    return times


def timing_row(nbytes, count, dtype, redop, algo, calls, comm, factor):
    """One table row from this rank's call times ``calls`` (collective: min, mean and max
    over ranks, and the slowest rank's median); ``busbw = algbw * factor``."""
    from mpi4py import MPI

    seconds = float(calls.mean())
    low, high = comm.allreduce(seconds, op=MPI.MIN), comm.allreduce(seconds, op=MPI.MAX)
    mean = comm.allreduce(seconds, op=MPI.SUM) / comm.size
    # The median call, for fits that must not be swayed by a rank that lost its core once.
    median = comm.allreduce(float(np.median(calls)), op=MPI.MAX)
    algbw = nbytes / high / 1e9 if high > 0 else 0.0
    return {"size": nbytes, "count": count, "type": dtype, "redop": redop,
            "algo": algo, "time_min_us": low * 1e6, "time_avg_us": mean * 1e6,
            "time_max_us": high * 1e6, "time_median_us": median * 1e6, "algbw_GBps": algbw,
            "busbw_GBps": algbw * factor}


def check_input(count, rank, dtype, device="cpu"):
    """Rank ``rank``'s correctness input: integers in [-3, 3], exact in every dtype (a
    product of 4 of them too)."""
    index = torch.arange(count, dtype=torch.int64, device=device)
    return ((index + 3 * rank) % 7 - 3).to(dtype)


def expected(count, ranks, op, dtype):
    """The exact result of reducing every rank's ``check_input`` with ``op``, in ``dtype``."""
    acc = check_input(count, 0, torch.float64)
    for rank in range(1, ranks):
        other = check_input(count, rank, torch.float64)
        acc = {"sum": torch.add, "avg": torch.add, "min": torch.minimum,
               "max": torch.maximum, "prod": torch.mul}[op](acc, other)
    if op == "avg":
        # The collectives' definition: the sum divided by p, floor division for integers.
        floating = torch.empty(0, dtype=dtype).is_floating_point()
        acc = acc / ranks if floating else torch.div(acc, ranks, rounding_mode="floor")
    return acc.to(dtype)


def count_wrong(plugin, algo, per, args, comm, device):
    """Elements that differ from the exact result after one call, summed over ranks."""
    from mpi4py import MPI

    dtype = DTYPES[args.dtype]
    send, recv = buffers(plugin, per, comm.size, dtype, device)
    send.copy_(plugin.inputs(per, comm.rank, comm.size, Exact(dtype, device, comm.size)))
    (plugin.checked or plugin.call)(algo, send, recv, [per] * comm.size, args, comm)()
    synchronize(recv)
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


def _save(collective, args, settings, rows, wrong, more):
    document = {"benchmark": collective, "settings": settings,
                "environment": report.environment(), "columns": list(report.COLUMNS),
                "rows": rows, "wrong": wrong, **more}
    if args.json:
        report.write_json(args.json, document)
    if args.hdf5:
        report.write_hdf5(args.hdf5, collective, rows,
                          {"settings": settings, "environment": document["environment"]})


def _print(comm, *lines):
    if comm.rank == 0 and lines:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
