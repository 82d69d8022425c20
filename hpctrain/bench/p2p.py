"""``hpctrain bench p2p``: ping-pong latency and bandwidth between ranks 0 and 1.

These are the α (latency) and β (seconds per byte) of the cost models: the line
``t(n) = α + β·n`` is fitted by least squares to the one-way times and printed in the footer.
Ranks other than 0 and 1 only take part in the barriers.
"""

import sys

import numpy as np

from .. import tags
from ..collectives.cost import nonnegative_fit
from ..errors import UsageError
from . import report
from .sizes import format_size, size_range

COLUMNS = ("size", "iters", "latency_us", "bandwidth_GBps")


def run(args, comm):
    """Measure every size; return 0 (ping-pong has no wrong values to count)."""
    if comm.size < 2:
        raise UsageError(f"bench p2p needs at least 2 ranks, got {comm.size}: "
                         "launch it with mpirun -np 2")
    if args.iters < 1 or args.warmup < 0:
        raise UsageError(f"need -n >= 1 and -w >= 0, got -n {args.iters} -w {args.warmup}")
    sizes = size_range(args.minbytes, args.maxbytes, args.stepfactor)
    settings = {"ranks": comm.size, "pair": "0<->1", "sizes": f"{format_size(args.minbytes)}..."
                f"{format_size(args.maxbytes)} x{args.stepfactor}", "iters": args.iters,
                "warmup": args.warmup}
    lines = report.header_lines("p2p", settings, comm)
    _print(comm, *lines, "#", f"# {'size':>10} {'iters':>7} {'latency':>10} {'bandwidth':>10}",
           f"# {'(B)':>10} {'':>7} {'(us)':>10} {'(GB/s)':>10}")
    buf = np.zeros(max(sizes), dtype=np.uint8)
    rows = []
    for size in sizes:
        seconds = ping_pong(buf[:size], args.iters, args.warmup, comm)
        row = {"size": size, "iters": args.iters, "latency_us": seconds * 1e6,
               "bandwidth_GBps": size / seconds / 1e9 if seconds > 0 else 0.0}
        rows.append(row)
        _print(comm, f"{size:>12} {args.iters:>7} {row['latency_us']:>10.2f} "
                     f"{row['bandwidth_GBps']:>10.3f}")
    alpha, beta = fit_alpha_beta([r["size"] for r in rows], [r["latency_us"] * 1e-6 for r in rows])
    if len(rows) < 2:
        _print(comm, "# alpha, beta: need at least two sizes to fit (-b < -e)")
    else:
        inverse = f"{1 / beta / 1e9:.3f} GB/s" if beta > 0 else "inf"
        _print(comm, f"# alpha (latency)          : {alpha * 1e6:.2f} us",
               f"# beta  (per byte)         : {beta * 1e9:.4f} ns/B  (1/beta = {inverse})",
               "# fitted by least squares on relative error: one-way time = alpha + beta * size")
    if comm.rank == 0:
        document = {"benchmark": "p2p", "settings": settings,
                    "environment": report.environment(), "columns": list(COLUMNS),
                    "rows": rows, "alpha_s": alpha, "beta_s_per_byte": beta}
        if args.json:
            report.write_json(args.json, document)
        if args.hdf5:
            report.write_hdf5(args.hdf5, "p2p", rows, {"settings": settings, "alpha_s": alpha,
                                                       "beta_s_per_byte": beta})
    return 0


def ping_pong(buf, iters, warmup, comm):
    """One-way time of ``buf`` between ranks 0 and 1: half the mean round trip (rank 0's)."""
    from mpi4py import MPI

    rank = comm.rank
    for i in range(warmup + iters):
        if i == warmup:
            comm.Barrier()
            start = MPI.Wtime()
        if rank == 0:
            comm.Send(buf, dest=1, tag=tags.BENCH_P2P)
            comm.Recv(buf, source=1, tag=tags.BENCH_P2P)
        elif rank == 1:
            comm.Recv(buf, source=0, tag=tags.BENCH_P2P)
            comm.Send(buf, dest=0, tag=tags.BENCH_P2P)
    seconds = (MPI.Wtime() - start) / iters / 2
    return comm.bcast(seconds, root=0)


def fit_alpha_beta(sizes, seconds):
    """Least-squares ``(alpha, beta)`` of ``seconds = alpha + beta * sizes``.

    Residuals are relative (weighted by 1/time): sizes span many orders of magnitude, and an
    unweighted fit would let the largest messages decide alpha as well as beta. Both are
    non-negative (:func:`hpctrain.collectives.cost.nonnegative_fit`): where the free fit's
    alpha would be negative (a link whose small messages are helped by a burst allowance,
    say), beta alone is fitted with alpha = 0, and vice versa.
    """
    x, y = np.asarray(sizes, float), np.asarray(seconds, float)
    if len(set(sizes)) < 2 or (y <= 0).any():
        return (float(np.mean(y)), 0.0)
    alpha, beta = nonnegative_fit(np.column_stack([1 / y, x / y]), np.ones(len(y)))
    return float(alpha), float(beta)


def _print(comm, *lines):
    if comm.rank == 0 and lines:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
