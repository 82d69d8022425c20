"""``hpctrain study allreduce``: sweep ranks × algorithms × sizes, fit the model, write a report.

Steps: ping-pong at 2 ranks gives α and β; timing NumPy's in-place add gives γ; the allreduce
benchmark runs once per rank count; α, β, γ are then also fitted by least squares to every
measured allreduce. The report folder holds ``study.h5`` (every measurement and both parameter
sets), ``params.json`` (the fitted model, reusable by ``study predict`` and training's
``--allreduce auto``), PNG plots and ``summary.md``.
"""

import json
import os
import tempfile
import time

import numpy as np

from ..bench import report
from ..bench.sizes import format_size
from . import costmodel, launcher, plots
from .sweep import machine_lines, rank_counts, say
from .predict import prediction_table, prediction_markdown
from .. import collectives
from ..collectives import auto

QUICK = {"np": "2,3", "sizes": "8:1M", "factor": 16, "iters": 5, "warmup": 1}


def run(args):
    """Run the whole study; return 0 if every launch succeeded and no result was wrong."""
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    ranks = rank_counts(args.np or "2,3,4", minimum=2)
    low, high = _size_span(args.sizes or "8:64M")
    factor, iters, warmup = args.factor or 4, args.iters or 10, args.warmup or 2
    os.makedirs(args.out, exist_ok=True)
    cores = os.cpu_count() or 1
    started = time.monotonic()

    say(f"p2p at 2 ranks ({args.launcher})")
    p2p = _bench(args, 2, "p2p", "-b", low or 1, "-e", high, "-f", factor, "-n", iters * 5,
                 "-w", warmup)
    gamma = measure_gamma(high)
    prior = costmodel.Params(p2p["alpha_s"], p2p["beta_s_per_byte"], gamma)
    rows = []
    for p in ranks:
        say(f"allreduce at {p} ranks{' (oversubscribed)' if p > cores else ''}")
        algos = ("--algos", args.algos) if args.algos else ()
        if args.profile:
            names = args.algos.split(",") if args.algos else collectives.available()
            algos = ("--algos", ",".join([*names, "auto"]), "--profile", args.profile)
        result = _bench(args, p, "allreduce", *algos, "-b", low, "-e", high, "-f", factor,
                        "-n", iters, "-w", warmup)
        rows += [{**row, "np": p, "oversubscribed": int(p > cores)} for row in result["rows"]]
    points = [(r["algo"], r["size"], r["np"], r["time_median_us"] * 1e-6) for r in rows]
    fitted = costmodel.fit(points)
    for row in rows:
        row["model_us"] = (costmodel.predict(row["algo"], row["size"], row["np"], fitted) * 1e6
                           if row["algo"] in costmodel.MODELLED else float("nan"))
    scale = prediction_table(fitted)
    write_outputs(args.out, p2p, rows, prior, fitted, scale, cores, ranks)
    wrong = sum(max(r["wrong"], 0) for r in rows)
    say(f"report in {args.out} ({time.monotonic() - started:.0f} s); wrong values: {wrong}")
    return 1 if wrong else 0


def measure_gamma(nbytes, repeats=5):
    """Seconds per byte of an in-place float32 add (the reduction of the cost model)."""
    count = max(nbytes // 4, 1 << 16)
    a, b = np.ones(count, np.float32), np.ones(count, np.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.add(a, b, out=a)
        best = min(best, time.perf_counter() - start)
    return best / (count * 4)


def write_outputs(out, p2p, rows, prior, fitted, scale, cores, ranks):
    """study.h5, params.json, the plots and summary.md."""
    env = report.environment()
    report.write_hdf5(os.path.join(out, "study.h5"), "allreduce", rows,
                      {"fitted": fitted.as_dict(), "p2p_prior": prior.as_dict(),
                       "cores": cores, "environment": env})
    _add_tables(os.path.join(out, "study.h5"), p2p["rows"], scale)
    report.write_json(os.path.join(out, "params.json"),
                      {"fitted": fitted.as_dict(), "p2p_prior": prior.as_dict(),
                       "switch_bytes": costmodel.DEFAULT_SWITCH_BYTES, "cores": cores,
                       "measured_best": auto.measured_best(rows)})
    for p in ranks:
        plots.busbw_vs_size(rows, p, os.path.join(out, f"busbw_p{p}.png"), cores)
    sizes = sorted({r["size"] for r in rows if r["size"] > 0})
    for size in {sizes[0], sizes[len(sizes) // 2], sizes[-1]}:
        plots.time_vs_ranks(rows, size, fitted, os.path.join(out, f"time_vs_p_{size}B.png"))
    plots.prediction(scale, os.path.join(out, "prediction.png"),
                     "predicted allreduce busbw at scale (fitted α, β, γ)")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(summary(rows, prior, fitted, scale, cores, env))


def _add_tables(path, p2p_rows, scale):
    import h5py

    with h5py.File(path, "a") as f:
        f.create_dataset("p2p", data=report._structured(p2p_rows))
        f.create_dataset("prediction", data=report._structured(scale))


def summary(rows, prior, fitted, scale, cores, env):
    """The report's markdown: set-up, parameters, model error, crossovers, prediction."""
    lines = ["# Allreduce scaling study", "",
             *machine_lines(cores, env, sorted({r["np"] for r in rows})), "",
             "## Model parameters", "",
             "| set | α (µs) | β (ns/B) | 1/β (GB/s) | γ (ns/B) |", "|---|---|---|---|---|"]
    for name, params in (("from p2p + local add", prior), ("fitted to allreduces", fitted)):
        inverse = f"{1 / params.beta / 1e9:.2f}" if params.beta > 0 else "∞"
        lines.append(f"| {name} | {params.alpha * 1e6:.2f} | {params.beta * 1e9:.4f} | "
                     f"{inverse} | {params.gamma * 1e9:.4f} |")
    lines += ["", "## Model error on every measured point (fitted parameters)", "",
              _error_summary(rows, prior, fitted), "", _point_table(rows), "",
              "## Crossovers: the size from which the ring beats tree and butterfly", "",
              _crossovers(rows, fitted), ""]
    if any(r["algo"] == "auto" for r in rows):
        lines += ["## `--allreduce auto` against the best fixed algorithm", "",
                  _auto_table(rows), ""]
    lines += ["## Prediction at scale (fitted parameters)", "", prediction_markdown(scale), ""]
    return "\n".join(lines)


def _auto_table(rows):
    """auto's median time against the fastest fixed algorithm's at every measured point."""
    points = {}
    for r in rows:
        points.setdefault((r["np"], r["size"]), {})[r["algo"]] = r
    lines = ["| p | size | auto chose | auto (µs) | best fixed | best (µs) | auto / best |",
             "|---|---|---|---|---|---|---|"]
    ratios = []
    for (p, size), by_algo in sorted(points.items()):
        mine = by_algo.get("auto")
        fixed = [r for a, r in by_algo.items() if a not in ("auto", "horovod")]
        if mine is None or not fixed or size <= 0:
            continue
        best = min(fixed, key=lambda r: r["time_median_us"])
        ratio = mine["time_median_us"] / best["time_median_us"]
        ratios.append(ratio)
        lines.append(f"| {p} | {format_size(size)} | {mine.get('chose', '?')} | "
                     f"{mine['time_median_us']:.1f} | {best['algo']} | "
                     f"{best['time_median_us']:.1f} | {ratio:.2f} |")
    if ratios:
        lines += ["", f"auto / best fixed: median {np.median(ratios):.2f}, worst "
                      f"{max(ratios):.2f} over {len(ratios)} points (1.00: auto ran the "
                      "fastest; the same algorithm timed twice differs by the noise)."]
    return "\n".join(lines)


def _error_summary(rows, prior, fitted):
    lines = ["| algorithm | median abs. error (fitted) | max abs. error (fitted) | "
             "median abs. error (p2p prior) |", "|---|---|---|---|"]
    for algo in sorted({r["algo"] for r in rows if r["algo"] in costmodel.MODELLED}):
        mine = [(r["algo"], r["size"], r["np"], r["time_median_us"] * 1e-6) for r in rows
                if r["algo"] == algo]
        err_fit = np.abs(costmodel.relative_errors(mine, fitted))
        err_prior = np.abs(costmodel.relative_errors(mine, prior))
        if len(err_fit):
            lines.append(f"| {algo} | {np.median(err_fit):.0%} | {err_fit.max():.0%} | "
                         f"{np.median(err_prior):.0%} |")
    return "\n".join(lines)


def _point_table(rows):
    lines = ["| p | size | algo | measured median (µs) | model (µs) | error |",
             "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["np"], r["size"], r["algo"])):
        star = "*" if r["oversubscribed"] else ""
        model = r["model_us"]
        error = f"{(model - r['time_median_us']) / r['time_median_us']:+.0%}" \
            if np.isfinite(model) and r["time_median_us"] > 0 else "n/a"
        shown = f"{model:.1f}" if np.isfinite(model) else "n/a"
        lines.append(f"| {r['np']}{star} | {format_size(r['size'])} | {r['algo']} | "
                     f"{r['time_median_us']:.1f} | {shown} | {error} |")
    return "\n".join(lines)


def _crossovers(rows, fitted):
    lines = ["| p | vs | predicted | measured |", "|---|---|---|---|"]
    for p in sorted({r["np"] for r in rows if r["np"] > 1}):
        for other in ("tree", "butterfly"):
            if not {other, "ring"} <= {r["algo"] for r in rows}:
                continue
            predicted = costmodel.crossover(other, p, fitted)
            measured = measured_crossover(rows, p, other)
            lines.append(f"| {p} | {other} | {_size_or_none(predicted)} | "
                         f"{_size_or_none(measured)} |")
    return "\n".join(lines)


def measured_crossover(rows, ranks, other):
    """Smallest measured size from which the ring is never slower than ``other`` again."""
    times = {}
    for r in rows:
        if r["np"] == ranks and r["algo"] in ("ring", other) and r["size"] > 0:
            times.setdefault(r["size"], {})[r["algo"]] = r["time_median_us"]
    sizes = sorted(s for s, t in times.items() if len(t) == 2)
    ring_wins = [times[s]["ring"] <= times[s][other] for s in sizes]
    for i, size in enumerate(sizes):
        if all(ring_wins[i:]):
            return None if i == 0 else size
    return None


def _size_or_none(size):
    return format_size(size) if size else "none in range"


def _bench(args, ranks, kind, *options):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{kind}.json")
        argv = launcher.hpctrain("bench", kind, *options, "--json", path)
        launcher.run(args.launcher, ranks, argv, args.launch_timeout)
        with open(path) as f:
            return json.load(f)


def _size_span(text):
    from ..bench.sizes import parse_size
    from ..errors import UsageError

    low, sep, high = text.partition(":")
    if not sep:
        raise UsageError(f"--sizes takes MIN:MAX like 8:64M, got {text!r}")
    return parse_size(low), parse_size(high)
