"""``hpctrain study allreduce``: sweep ranks × algorithms × sizes, fit the model, write a report.

Steps: ping-pong at 2 ranks gives α and β; timing NumPy's in-place add gives γ; the allreduce
benchmark runs once per rank count; α, β, γ are then also fitted by least squares to the
measured allreduces (those with no more ranks than cores, where they determine all three).
The report folder holds ``study.h5`` (every measurement and both parameter sets),
``params.json`` (the fitted model, reusable by ``study predict`` and training's
``--allreduce auto``), PNG plots and ``summary.md``. With ``--profile`` every rank count is
benchmarked twice, so that auto's margin over the best fixed algorithm can be set against
the noise: how far a ratio of two algorithms timed side by side moves between the runs.
"""

import json
import os
import tempfile
import time

import numpy as np

from ..bench import report
from ..bench.sizes import format_size
from . import crossover, launcher, plots
from .sweep import machine_lines, rank_counts, say
from .predict import prediction_table, prediction_markdown
from .. import collectives
from ..data.atomic import write_text
from ..collectives import auto, cost

#: The smallest size a study sweeps: one element of the benchmark's float32.
SMALLEST = 4
#: Ranks per node assumed for the prediction at scale when the study ran on one machine.
SCALE_PER_NODE = 8
def run(args):
    """Run the whole study (``args``: an :class:`~.config.AllreduceStudy`'s fields, defaults
    and ranges included); return 0 if every launch succeeded and no result was wrong."""
    ranks = rank_counts(args.np, minimum=2)
    factor, iters, warmup = args.factor, args.iters, args.warmup
    low, high = _size_span(args.sizes, factor)
    os.makedirs(args.out, exist_ok=True)
    cores = os.cpu_count() or 1
    started = time.monotonic()

    say(f"p2p at 2 ranks ({args.launcher})")
    p2p = _bench(args, 2, "p2p", "-b", low, "-e", high, "-f", factor, "-n", iters * 5,
                 "-w", warmup)
    gamma = measure_gamma(high)
    prior = cost.Params(p2p["alpha_s"], p2p["beta_s_per_byte"], gamma)
    names = [a for a in (args.algos.split(",") if args.algos else collectives.available())
             if a != "auto"]
    runs = [names]
    if args.profile:
        # auto beside every fixed algorithm, twice, the second time in the reverse order.
        runs = [[*names, "auto"], ["auto", *names[::-1]]]
    rows, repeat = [], []
    for p in ranks:
        for i, algos in enumerate(runs):
            again = f", run {i + 1} of {len(runs)}" if len(runs) > 1 else ""
            say(f"allreduce at {p} ranks{' (oversubscribed)' if p > cores else ''}{again}")
            options = ("--profile", args.profile) if args.profile else ()
            result = _bench(args, p, "allreduce", "--algos", ",".join(algos), *options,
                            "-b", low, "-e", high, "-f", factor, "-n", iters, "-w", warmup)
            (repeat if i else rows).extend({**row, "np": p, "oversubscribed": int(p > cores)}
                                           for row in result["rows"])
    for row in rows + repeat:
        row["nodes"] = nodes_of(row["np"], args.ranks_per_node)
    points = [(r["algo"], r["size"], r["np"], r["time_median_us"] * 1e-6, r.get("nodes", 1))
              for r in rows]
    fit_ranks, all_three = fit_plan(points, cores)
    # Points that cannot separate β from γ (every algorithm measured sends as many bytes as
    # it reduces, times two, say) keep γ at the local add's measured value.
    fitted = cost.fit([pt for pt in points if pt[2] in fit_ranks],
                      gamma=None if all_three else prior.gamma)
    modelled = cost.modelled()
    for row in rows + repeat:
        row["model_us"] = (cost.predict(row["algo"], row["size"], row["np"], fitted,
                                        row["nodes"]) * 1e6
                           if row["algo"] in modelled else float("nan"))
    scale = prediction_table(fitted, ranks_per_node=args.ranks_per_node or SCALE_PER_NODE)
    write_outputs(args.out, p2p, rows, repeat, prior, fitted, fit_ranks, all_three, scale,
                  cores, ranks, args.ranks_per_node)
    if repeat:
        say(auto_verdict(auto_points(rows, repeat)))
    wrong = sum(max(r["wrong"], 0) for r in rows + repeat)
    say(f"report in {args.out} ({time.monotonic() - started:.0f} s); wrong values: {wrong}")
    return 1 if wrong else 0


def nodes_of(ranks, ranks_per_node):
    """The nodes ``ranks`` ranks span when placed ``ranks_per_node`` to a node (by slot);
    one when ``ranks_per_node`` is 0 (a single machine)."""
    return -(-ranks // ranks_per_node) if ranks_per_node else 1


def fit_plan(points, cores):
    """``(rank counts, all_three)``: the rank counts whose points the fit uses, and whether
    those points determine α, β and γ together (else γ is not fitted).

    The rank counts with no more ranks than ``cores`` when their points determine all three;
    else every rank count when those do; else the ones within the cores again (every one if
    none is), fitted for α and β only. Points that span several nodes (a cluster, real or
    emulated) are all used: only they show the links between nodes."""
    ranks = sorted({point[2] for point in points})
    inside = [p for p in ranks if p <= cores and p > 1] or ranks
    if any(point[4:] and point[4] > 1 for point in points):
        inside = ranks
    for subset in (inside, ranks):
        if cost.determined([pt for pt in points if pt[2] in subset]):
            return subset, True
    return inside, False


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


def write_outputs(out, p2p, rows, repeat, prior, fitted, fit_ranks, all_three, scale, cores,
                  ranks, ranks_per_node=0):
    """study.h5, params.json, the plots and summary.md."""
    env = report.environment()
    report.write_hdf5(os.path.join(out, "study.h5"), "allreduce", rows,
                      {"fitted": fitted.as_dict(), "p2p_prior": prior.as_dict(),
                       "fit_ranks": fit_ranks, "cores": cores, "environment": env},
                      {"p2p": p2p["rows"], "prediction": scale,
                       **({"allreduce_repeat": repeat} if repeat else {})})
    report.write_json(os.path.join(out, "params.json"),
                      {"fitted": fitted.as_dict(), "p2p_prior": prior.as_dict(),
                       "fit_ranks": fit_ranks, "gamma_fitted": all_three,
                       "switch_bytes": cost.DEFAULT_SWITCH_BYTES, "cores": cores,
                       "ranks_per_node": ranks_per_node,
                       "measured_best": auto.measured_best(rows)})
    for p in ranks:
        plots.busbw_vs_size(rows, p, os.path.join(out, f"busbw_p{p}.png"), cores)
    sizes = sorted({r["size"] for r in rows if r["size"] > 0})
    for size in {sizes[0], sizes[len(sizes) // 2], sizes[-1]}:
        plots.time_vs_ranks(rows, size, fitted, os.path.join(out, f"time_vs_p_{size}B.png"),
                            cores, ranks_per_node)
    title = "predicted allreduce {} at scale (fitted α, β, γ)"
    plots.prediction(scale, os.path.join(out, "prediction.png"), title.format("busbw"))
    plots.prediction(scale, os.path.join(out, "prediction_time.png"), title.format("time"),
                     "time_us")
    write_text(os.path.join(out, "summary.md"),
               summary(rows, repeat, prior, fitted, fit_ranks, all_three, scale, cores, env))


def summary(rows, repeat, prior, fitted, fit_ranks, all_three, scale, cores, env):
    """The report's markdown: set-up, parameters, model error, crossovers, auto, prediction."""
    lines = ["# Allreduce scaling study", "",
             *machine_lines(cores, env, sorted({r["np"] for r in rows})), "",
             "## Model parameters", "",
             "| set | α (µs) | β (ns/B) | 1/β (GB/s) | γ (ns/B) | α' (µs) | 1/β' (GB/s) |",
             "|---|---|---|---|---|---|---|"]
    for name, params in (("from p2p + local add", prior), ("fitted to allreduces", fitted)):
        lines.append(f"| {name} | {params.alpha * 1e6:.2f} | {params.beta * 1e9:.4f} | "
                     f"{_rate(params.beta)} | {params.gamma * 1e9:.4f} | "
                     f"{'=' if params.alpha_inter is None else f'{params.alpha_inter * 1e6:.2f}'}"
                     f" | {'=' if params.beta_inter is None else _rate(params.beta_inter)} |")
    lines += ["", "α', β': between nodes (`=`: the same as inside, one level fitted)."]
    lines += ["", fit_note(rows, fit_ranks, cores, all_three), "",
              "## Model error on every measured point (fitted parameters)", "",
              _error_summary(rows, prior, fitted, fit_ranks), "", _point_table(rows, fit_ranks),
              "", "## Crossovers: the size from which on the ring is never slower than the "
              "other algorithms auto's model may choose", "", _crossovers(rows, fitted), ""]
    if any(r["algo"] == "auto" for r in rows):
        lines += ["## `--allreduce auto` against the best fixed algorithm", "",
                  _auto_table(rows, repeat), ""]
    lines += ["## Prediction at scale (fitted parameters)", "", prediction_markdown(scale), ""]
    return "\n".join(lines)


def _rate(beta):
    return f"{1 / beta / 1e9:.2f}" if beta > 0 else "∞"


def fit_note(rows, fit_ranks, cores, all_three=True):
    """Which points α, β, γ were fitted to, and why."""
    fitted = cost.fitted_algorithms()
    modelled = [r for r in rows if r["algo"] in fitted]
    used = sum(r["np"] in fit_ranks for r in modelled)
    over = sorted({r["np"] for r in rows if r["np"] > cores})
    ranks = ", ".join(map(str, fit_ranks))
    if not all_three:
        return (f"α and β fitted to the {used} measured points at p = {ranks}; γ is the local "
                f"add's, measured: these points cannot tell the time spent reducing from the "
                f"time spent sending (every algorithm measured sends the same multiple of "
                f"the bytes it reduces), so only a sum of β and γ could be fitted.")
    if not any(p > cores for p in fit_ranks):
        left = f"; the oversubscribed points (p = {', '.join(map(str, over))}, marked *) " \
               "are left out of the fit, and their errors are shown apart" if over else ""
        return f"Fitted to the {used} measured points at p = {ranks}, none oversubscribed{left}."
    return (f"Fitted to all {used} measured points at p = {ranks}, oversubscribed ones (*) "
            f"included: the points with at most {cores} ranks do not determine α, β and γ.")


def _error_summary(rows, prior, fitted, fit_ranks):
    lines = ["| algorithm | median abs. error, fitted points | max abs. error, fitted points | "
             "median abs. error, other points | median abs. error, p2p prior (all) |",
             "|---|---|---|---|---|"]
    for algo in sorted({r["algo"] for r in rows if r["algo"] in cost.modelled()}):
        mine = [(r["algo"], r["size"], r["np"], r["time_median_us"] * 1e-6, r.get("nodes", 1))
                for r in rows if r["algo"] == algo]
        inside = np.abs(cost.relative_errors([m for m in mine if m[2] in fit_ranks], fitted))
        others = np.abs(cost.relative_errors([m for m in mine if m[2] not in fit_ranks],
                                             fitted))
        err_prior = np.abs(cost.relative_errors(mine, prior))
        if len(err_prior):
            lines.append(f"| {algo} | {_percent(np.median, inside)} | {_percent(np.max, inside)}"
                         f" | {_percent(np.median, others)} | {np.median(err_prior):.0%} |")
    return "\n".join(lines)


def _percent(statistic, values):
    return f"{statistic(values):.0%}" if len(values) else "n/a"


def _point_table(rows, fit_ranks):
    lines = ["| p | size | algo | measured median (µs) | model (µs) | error | in fit |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["np"], r["size"], r["algo"])):
        star = "*" if r["oversubscribed"] else ""
        model = r["model_us"]
        error = f"{(model - r['time_median_us']) / r['time_median_us']:+.0%}" \
            if np.isfinite(model) and r["time_median_us"] > 0 else "n/a"
        shown = f"{model:.1f}" if np.isfinite(model) else "n/a"
        fitted = "yes" if r["np"] in fit_ranks and r["algo"] in cost.fitted_algorithms() \
            else "no"
        lines.append(f"| {r['np']}{star} | {format_size(r['size'])} | {r['algo']} | "
                     f"{r['time_median_us']:.1f} | {shown} | {error} | {fitted} |")
    return "\n".join(lines)


def _crossovers(rows, fitted):
    lines = ["Predicted at the measured sizes (like for like with the measurement) and at every "
             "power of two in between.", "",
             "| p | vs | predicted | predicted, every power of two | measured |",
             "|---|---|---|---|---|"]
    algos = {r["algo"] for r in rows}
    for p in sorted({r["np"] for r in rows if r["np"] > 1}):
        for other in (a for a in auto.model_choices() if a != "ring"):
            if not {other, "ring"} <= algos:
                continue
            sizes, wins = measured_ring_wins(rows, p, other)
            fine = crossover.powers_of_two(sizes[0], sizes[-1]) if sizes else []
            nodes = next(r.get("nodes", 1) for r in rows if r["np"] == p)
            predicted = [describe_crossover(s, crossover.ring_wins(other, p, fitted, s,
                                                                   nodes=nodes))
                         for s in (sizes, fine)]
            lines.append(
                f"| {p} | {other} | {predicted[0]} | {predicted[1]} | "
                f"{describe_crossover(sizes, wins)} |")
    return "\n".join(lines)


def measured_ring_wins(rows, ranks, other):
    """``(sizes, wins)``: the sizes at which both the ring and ``other`` were measured at
    ``ranks`` ranks, and whether the ring's median was at most ``other``'s there."""
    times = {}
    for r in rows:
        if r["np"] == ranks and r["algo"] in ("ring", other) and r["size"] > 0:
            times.setdefault(r["size"], {})[r["algo"]] = r["time_median_us"]
    sizes = sorted(s for s, t in times.items() if len(t) == 2)
    return sizes, [times[s]["ring"] <= times[s][other] for s in sizes]


def describe_crossover(sizes, wins):
    """A crossover in words: ``from 2 KiB``, or why there is none in range."""
    size = crossover.crossover_size(sizes, wins)
    if not sizes:
        return "not measured"
    if all(wins):
        return f"ring always wins in range ({format_size(sizes[0])}+)"
    if not any(wins):
        return "ring never wins in range"
    if size is None:
        return "none: ring wins only below the largest size"
    return f"from {format_size(size)}"


def auto_points(rows, repeat):
    """auto against the best fixed algorithm at every (p, size) where auto ran, with the
    noise there: a list of dicts, in order of p and size.

    Only ratios measured side by side in one run count (the load drifts between runs):
    ``ratio`` is the geometric mean over the runs of auto's time over the best fixed
    algorithm's, the best being the fixed algorithm that auto can choose (not Horovod) with
    the smallest such mean. ``noise`` is how far such a ratio moves from one run to the
    other: the median, over the other fixed algorithms, of ``max / min - 1`` of their two
    ratios to the best; NaN with one run or one fixed algorithm.
    """
    tables = [{}, {}]
    for table, source in zip(tables, (rows, repeat)):
        for r in source:
            if r["size"] > 0:
                table.setdefault((r["np"], r["size"]), {})[r["algo"]] = r["time_median_us"]
    points = []
    for key, first in sorted(tables[0].items()):
        never = auto.never_chosen()
        fixed = [a for a in first if a != "auto" and a not in never]
        if "auto" not in first or not fixed:
            continue
        second = tables[1].get(key, {})
        runs = [first] + ([second] if set(first) <= set(second) else [])
        best = min(fixed, key=lambda a: _mean_ratio(runs, a, "auto"))
        spread = [max(r) / min(r) - 1 for r in
                  ([run[a] / run[best] for run in runs] for a in fixed if a != best)
                  if len(r) == 2]
        points.append({"np": key[0], "size": key[1],
                       "chose": _chosen(rows, key),
                       "auto_us": float(np.mean([run["auto"] for run in runs])),
                       "best": best, "best_us": float(np.mean([run[best] for run in runs])),
                       "ratio": _mean_ratio(runs, "auto", best),
                       "noise": float(np.median(spread)) if spread else float("nan")})
    return points


def _mean_ratio(runs, algo, other):
    return float(np.exp(np.mean([np.log(run[algo] / run[other]) for run in runs])))


def _chosen(rows, key):
    return next((r.get("chose", "?") for r in rows
                 if (r["np"], r["size"]) == key and r["algo"] == "auto"), "?")


def within_noise(point):
    """auto is no slower than the best fixed algorithm by more than the point's noise."""
    return point["ratio"] - 1 <= point["noise"]


def auto_verdict(points):
    """The one-line verdict: is auto ever slower than the best fixed choice beyond noise?"""
    if not points:
        return "Verdict: auto was not measured."
    if any(not np.isfinite(p["noise"]) for p in points):
        return ("Verdict: none, the noise is unknown (it takes two runs and two fixed "
                "algorithms at every point, as `study allreduce --profile` measures them).")
    slower = [p for p in points if not within_noise(p)]
    worst = max(points, key=lambda p: p["ratio"] - 1 - p["noise"])
    if not slower:
        return (f"Verdict: auto is never slower than the best fixed choice beyond noise "
                f"({len(points)} points; closest: p = {worst['np']}, "
                f"{format_size(worst['size'])}, auto / best {worst['ratio']:.2f} against "
                f"noise {worst['noise']:.0%}).")
    named = ", ".join(f"p = {p['np']} {format_size(p['size'])} ({p['ratio']:.2f} > "
                      f"1 + {p['noise']:.2f})" for p in slower)
    return (f"Verdict: auto is slower than the best fixed choice beyond noise at "
            f"{len(slower)} of {len(points)} points: {named}.")


def _auto_table(rows, repeat):
    """auto's time against the fastest fixed algorithm's at every measured point."""
    points = auto_points(rows, repeat)
    lines = ["| p | size | auto chose | auto (µs) | best fixed | best (µs) | auto / best | "
             "noise | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for pt in points:
        verdict = "n/a" if not np.isfinite(pt["noise"]) else \
            "within noise" if within_noise(pt) else "SLOWER"
        lines.append(f"| {pt['np']} | {format_size(pt['size'])} | {pt['chose']} | "
                     f"{pt['auto_us']:.1f} | {pt['best']} | {pt['best_us']:.1f} | "
                     f"{pt['ratio']:.2f} | {pt['noise']:.0%} | {verdict} |")
    if points:
        ratios = [pt["ratio"] for pt in points]
        lines += ["", f"auto / best fixed: median {np.median(ratios):.2f}, worst "
                      f"{max(ratios):.2f} over {len(ratios)} points. Times: the mean of the two "
                      "runs; auto / best: the geometric mean of the two runs' ratios, each "
                      "measured side by side; noise: how far the other fixed algorithms' "
                      "ratios to the best moved between the runs (median).", "",
                  auto_verdict(points)]
    return "\n".join(lines)


def _bench(args, ranks, kind, *options):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{kind}.json")
        argv = launcher.hpctrain("bench", kind, *options, "--json", path)
        launcher.run(args.launcher, ranks, argv, args.launch_timeout)
        with open(path) as f:
            return json.load(f)


def _size_span(text, factor):
    from ..bench.sizes import size_range
    from ..units import parse_size
    from ..errors import UsageError

    low, sep, high = text.partition(":")
    if not sep:
        raise UsageError(f"--sizes takes MIN:MAX like 8:64M, got {text!r}")
    low, high = parse_size(low), parse_size(high)
    if low < SMALLEST:
        # From 0 the sizes never grow (0 times any factor is 0), and below one float32
        # element the benchmark reduces 0 bytes: nothing to fit or plot. Refused here,
        # before any job is launched.
        raise UsageError(f"--sizes minimum must be at least {SMALLEST} bytes (one float32 "
                         f"element), got {text!r}; e.g. 8:64M")
    size_range(low, high, factor)   # the benchmarks' own checks, before any launch
    return low, high
