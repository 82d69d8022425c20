"""``hpctrain bench allreduce``: every algorithm side by side, in the manner of nccl-tests.

For each size, every algorithm is timed on the same buffer in the same run, so ratios between
algorithms are meaningful even on a shared, noisy machine (absolute times are not).

Timing: ``-w`` warm-up calls, a barrier, then ``-n`` timed calls; each rank's time is the mean
over the timed calls, and the table shows its min/avg/max over ranks. ``algbw`` is the size
divided by the *max* time (a collective is done when its last rank is); ``busbw`` is
``algbw * 2(p-1)/p``, the traffic each rank's link carries in a bandwidth-optimal allreduce,
comparable across rank counts and against a link's bandwidth. The JSON and HDF5 outputs also
hold ``time_median_us``, the slowest rank's median call, which studies fit models to.
The timed loop runs on zeros (stable values, no denormals) with the collectives'
argument-agreement check off, so the times are the algorithms' own; the correctness pass
(``-c 1``) runs with the check on, on small integers whose sum is exact in every dtype and
in any order, and counts wrong elements.
"""

import sys

import numpy as np
import torch

from .. import collectives, faults, gpu_checks, mpi_support, tags
from ..devices import rank_device
from ..errors import UsageError
from ..runtime import checks
from . import report
from .sizes import format_size, size_range

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64, "int32": torch.int32, "int64": torch.int64}
OPS = ("sum", "avg", "min", "max", "prod")
COLUMNS = ("size", "count", "type", "redop", "algo", "time_min_us", "time_avg_us",
           "time_max_us", "time_median_us", "algbw_GBps", "busbw_GBps", "wrong")


def default_algos():
    """Every registered algorithm, Horovod last (its background thread starts on first use)."""
    return sorted(collectives.available(), key=lambda name: (name == "horovod", name))


def run(args, comm):
    """Run the benchmark; return the number of wrong values over all sizes, algorithms, ranks."""
    faults.inject("bench.start", comm.rank)
    with checks(comm):   # the first collective: bad options end every rank alike
        algos = validate(args)
    dtype = DTYPES[args.dtype]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    counts = sorted({size // itemsize for size in size_range(args.minbytes, args.maxbytes,
                                                             args.stepfactor)})
    device = rank_device(args.device, comm)   # collective: one GPU per node-local rank
    algos, left_out = horovod_on_device(algos, args, comm)     # collective with cuda
    # Asked once, before any device buffer reaches mpi4py: an MPI that cannot read device
    # memory crashes on it (a segmentation fault, not an exception).
    awareness = mpi_support.cuda_awareness(comm) if device.type == "cuda" else None
    settings = {"ranks": comm.size, "algos": ",".join(algos), "type": args.dtype,
                "redop": args.op, "sizes": f"{format_size(args.minbytes)}..."
                f"{format_size(args.maxbytes)} x{args.stepfactor}", "iters": args.iters,
                "warmup": args.warmup, "check": args.check, "device": args.device}
    if awareness is not None:
        settings["cuda_aware_mpi"] = str(awareness)
    _print(comm, *report.header_lines("allreduce", settings, comm))
    if left_out:
        _print(comm, left_out)
    _print(comm, *_column_header())
    if "auto" in algos:
        collectives.auto.use(collectives.auto.load(args.profile, comm))  # collective
    rows, reference = [], None
    # Horovod's background thread, once started, polls MPI every cycle and slows whatever runs
    # after it on shared cores: it is timed last, over all sizes, and then stopped.
    for group in ([a for a in algos if a != "horovod"], [a for a in algos if a == "horovod"]):
        if group == ["horovod"] and len(algos) > 1:
            _print(comm, "# horovod: timed after the others (its background thread would "
                         "slow them), then shut down")
        for count in counts if group else ():
            buf = torch.zeros(count, dtype=dtype, device=device)
            want = expected(count, comm.size, args.op, dtype).to(device) if args.check else None
            # At the smallest size, a bare mpi4py Sendrecv of the same buffer is timed
            # beside the algorithms: the floor that a point-to-point algorithm's small
            # messages are measured against.
            first = count == counts[0] and group != ["horovod"] and count > 0
            measured = measure(buf, group, args, comm, reference=first, awareness=awareness)
            if first:
                reference = measured.pop()
                reference["path"] = sendrecv_path(buf, awareness)
            for row in measured:
                row["wrong"] = count_wrong(buf, row["algo"], args, comm, want) \
                    if args.check else -1
                rows.append(row)
                _print(comm, format_row(row))
    if "horovod" in algos:
        collectives.horovod.shutdown()
    if "auto" in algos:
        # Which algorithm ran: the row's own, or auto's choice at that size.
        for row in rows:
            row["chose"] = collectives.auto.choice(row["size"], comm.size)[0] \
                if row["algo"] == "auto" else row["algo"]
        _print(comm, "# auto chose: " + "  ".join(
            f"{format_size(row['size'])} {row['chose']}" for row in rows
            if row["algo"] == "auto"))
    wrong = sum(max(row["wrong"], 0) for row in rows)
    _print(comm, *footer_lines(rows, algos, wrong, args.check))
    if reference is not None:
        _print(comm, *reference_lines(rows, reference, comm.size))
    if comm.rank == 0:
        _save(args, settings, rows, wrong, reference)
    return wrong


def validate(args):
    """The algorithms to run, after checking every option (local: no communication)."""
    algos = args.algos.split(",") if args.algos else default_algos()
    unknown = [name for name in algos if name not in collectives.ALGORITHMS and name != "auto"]
    if unknown:
        raise UsageError(f"unknown algorithm(s) {', '.join(unknown)} in --algos; valid: "
                         f"{', '.join(sorted(collectives.ALGORITHMS))}, auto")
    if ("auto" in algos) != bool(getattr(args, "profile", None)):
        raise UsageError("--algos auto and --profile PARAMS_JSON go together (auto chooses "
                         "from the profile that `hpctrain study allreduce` writes)")
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


#: Timed rounds per size: the algorithms take turns, ROUNDS times, in rotated order.
ROUNDS = 4


def measure(buf, algos, args, comm, reference=False, awareness=None):
    """Time ``-n`` calls of each of ``algos`` on ``buf``; one table row per algorithm, and
    with ``reference`` one more row last: :func:`sendrecv_call` timed the same way (on the
    path :func:`sendrecv_path` chooses from ``awareness``, MPI's CUDA-awareness).

    Every algorithm first makes its ``-w`` warm-up calls. The timed calls are then split
    into up to ``ROUNDS`` rounds in which the algorithms take turns, in an order rotated
    each round: on a shared machine the load drifts within seconds, and a first algorithm
    timed in one block would meet other conditions than the last (10-25 % at 4 MiB here).
    """
    buf.zero_()
    calls = {algo: _allreduce_call(buf, algo, args.op, comm) for algo in algos}
    if reference:
        calls[SENDRECV] = sendrecv_call(buf, comm, sendrecv_path(buf, awareness))
    times = time_calls(calls, args, comm, buf)
    return [_row(buf, name, np.array(times[name]), args, comm) for name in calls]


def time_calls(calls, args, comm, buf):
    """``{name: [seconds of each timed call on this rank]}`` for ``calls`` (name -> a
    function of no arguments), timed as :func:`measure` says; ``buf``: a tensor whose
    device is synchronised around each timed loop.

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
            _sync(buf)
            comm.Barrier()  # synchronisation point: every rank starts the timed loop together
            stamps = np.empty(iters + 1)
            faults.inject("bench.allreduce", comm.rank)
            stamps[0] = wtime()
            for i in range(iters):
                call()
                stamps[i + 1] = wtime()
            _sync(buf)
            stamps[-1] = wtime()
            times[name].extend(np.diff(stamps))
    return times


#: The name of the reference row (one bare Sendrecv per rank pair), and its messages' tag.
SENDRECV, SENDRECV_TAG = "sendrecv", tags.BENCH_SENDRECV


def _allreduce_call(buf, algo, op, comm):
    allreduce = collectives.allreduce
    return lambda: allreduce(buf, op, algo, comm, False)   # positional: cheaper to pass


def sendrecv_path(buf, awareness):
    """How the Sendrecv reference moves ``buf``: ``host`` (a host buffer), ``direct`` (device
    memory straight to a CUDA-aware MPI) or ``staged`` (through host memory).

    ``awareness`` is :func:`hpctrain.mpi_support.cuda_awareness`'s answer. Only a definite
    yes goes direct: an MPI that cannot read device memory crashes the process on it, while
    staging is only slower (the collectives decide the same way)."""
    if not getattr(buf, "is_cuda", False):
        return "host"
    return "direct" if awareness is not None and awareness.aware is True else "staged"


def sendrecv_call(buf, comm, path=None):
    """A call that swaps ``buf`` with a partner (``rank ^ 1``) in one mpi4py ``Sendrecv``;
    the last rank of an odd count has no partner and sends to itself. The same kind of call
    as the collectives' own messages, timed by the same loop: the point-to-point floor of a
    small allreduce. On ``comm`` itself: the collectives run on their own duplicate, and
    nothing else is in flight here.

    ``path`` (from :func:`sendrecv_path`; by default ``staged`` for a CUDA buffer, since
    whether MPI is CUDA-aware was not said): ``staged`` copies the device buffer into host
    memory, exchanges host buffers and copies the result back to the device, as the
    collectives' staged path does, so that it is compared with like; mpi4py is never given
    device memory then. The call's ``received`` is where the partner's data arrives (a
    transport view, on ``buf``'s device)."""
    peer = comm.rank ^ 1 if comm.rank ^ 1 < comm.size else comm.rank
    path = path or sendrecv_path(buf, None)
    flat = collectives.buffers.flatten(buf)[0]   # the transport view the collectives send
    _sync(buf)
    sendrecv = comm.Sendrecv
    if path == "staged":
        return _staged_sendrecv(flat, peer, sendrecv)
    received = flat.clone() if buf.is_cuda else flat.copy()
    call = lambda: sendrecv(flat, peer, SENDRECV_TAG, received, peer, SENDRECV_TAG)  # noqa: E731
    call.received = received
    return call


def _staged_sendrecv(flat, peer, sendrecv):
    # Page-locked host buffers, allocated once: the copies are DMA transfers, as in the
    # collectives' staging. A copy into pageable or page-locked host memory returns when it
    # is done, so MPI reads finished data.
    if isinstance(flat, np.ndarray):
        flat = torch.from_numpy(flat)   # a host tensor (tests): the same copies, unpinned
    pin = flat.is_cuda
    send = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=pin)
    recv = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=pin)
    send_np, recv_np = send.numpy(), recv.numpy()
    received = flat.clone()

    def call():
        send.copy_(flat)
        sendrecv(send_np, peer, SENDRECV_TAG, recv_np, peer, SENDRECV_TAG)
        received.copy_(recv)
    call.received = received
    return call


def reference_lines(rows, reference, ranks):
    """The footer's small-message comparison: each algorithm at the smallest size against
    ``ceil(lg p)`` bare Sendrecvs (the fewest messages any allreduce needs per rank).

    Medians (the slowest rank's median call), not means: at a few microseconds a mean is
    decided by the few calls that lost their core to another process."""
    steps = max(1, (ranks - 1).bit_length())   # ceil(lg p), and 1 for p = 1
    one = reference["time_median_us"]
    floor_us = steps * one
    size = reference["size"]
    lines = [f"# Small messages ({format_size(size)}): one bare mpi4py Sendrecv between rank "
             f"pairs takes {one:.2f} us (median call, same timing loop); "
             f"ceil(lg p) = {steps} of them: {floor_us:.2f} us"]
    if reference.get("path") == "staged":
        lines.append("#   Sendrecv staged through host memory (device -> host, Sendrecv, "
                     "host -> device): MPI is not known to be CUDA-aware")
    ratios = [f"{row['algo']} {row['time_median_us'] / floor_us:.2f}x" for row in rows
              if row["size"] == size and floor_us > 0]
    if ratios:
        lines.append("#   median time / (ceil(lg p) x Sendrecv): " + "  ".join(ratios))
    return lines


def _row(buf, algo, calls, args, comm):
    return timing_row(buf.numel() * buf.element_size(), buf.numel(), args.dtype, args.op,
                      algo, calls, comm, bus_factor(comm.size))


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


def bus_factor(ranks):
    """nccl-tests' bus-bandwidth factor for allreduce: 2(p-1)/p."""
    return 2 * (ranks - 1) / ranks


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


def count_wrong(buf, algo, args, comm, want):
    """Elements that differ from ``want`` after one checked call, summed over ranks."""
    from mpi4py import MPI

    buf.copy_(check_input(buf.numel(), comm.rank, buf.dtype, buf.device))
    collectives.allreduce(buf, op=args.op, algo=algo, comm=comm, check=True)
    if buf.numel() and faults.selected("bench.corrupt", comm.rank):
        buf[0] += 1  # proves that a wrong value is counted and fails the run
    got, ref = buf.to(torch.float64), want.to(torch.float64)
    if args.op == "avg" and buf.is_floating_point():
        # The only rounding is the division by p (sums of these inputs are exact).
        tolerance = torch.finfo(buf.dtype).eps * ref.abs()
        bad = int(((got - ref).abs() > tolerance).sum())
    else:
        bad = int((got != ref).sum())
    return comm.allreduce(bad, op=MPI.SUM)


def format_row(row):
    """One line of the table, in nccl-tests' column order."""
    wrong = "N/A" if row["wrong"] < 0 else row["wrong"]
    return (f"{row['size']:>12} {row['count']:>11} {row['type']:>8} {row['redop']:>5} "
            f"{row['algo']:>10} {row['time_min_us']:>10.1f} {row['time_avg_us']:>10.1f} "
            f"{row['time_max_us']:>10.1f} {row['algbw_GBps']:>7.3f} {row['busbw_GBps']:>7.3f} "
            f"{wrong:>6}")


def _column_header():
    return ["#",
            f"# {'size':>10} {'count':>11} {'type':>8} {'redop':>5} {'algo':>10} "
            f"{'time-min':>10} {'time-avg':>10} {'time-max':>10} {'algbw':>7} {'busbw':>7} "
            f"{'#wrong':>6}",
            f"# {'(B)':>10} {'(elements)':>11} {'':>8} {'':>5} {'':>10} {'(us)':>10} "
            f"{'(us)':>10} {'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"]


def footer_lines(rows, algos, wrong, checked):
    """nccl-tests' footer: wrong-value total, then average bus bandwidth per algorithm."""
    verdict = "N/A (no check, -c 0)" if not checked else \
        f"{wrong} {'OK' if wrong == 0 else 'FAILED'}"
    lines = [f"# Out of bounds values : {verdict}", "# Avg bus bandwidth (GB/s):"]
    for algo in algos:
        values = [row["busbw_GBps"] for row in rows if row["algo"] == algo]
        lines.append(f"#   {algo:<12} {np.mean(values) if values else 0.0:.3f}")
    return lines


def _save(args, settings, rows, wrong, reference=None):
    document = {"benchmark": "allreduce", "settings": settings,
                "environment": report.environment(), "columns": list(COLUMNS),
                "rows": rows, "wrong": wrong, "sendrecv_reference": reference}
    if args.json:
        report.write_json(args.json, document)
    if args.hdf5:
        report.write_hdf5(args.hdf5, "allreduce", rows,
                          {"settings": settings, "environment": document["environment"]})


def _sync(buf):
    if buf.is_cuda:
        torch.cuda.synchronize(buf.device)


def _print(comm, *lines):
    if comm.rank == 0 and lines:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
