"""``hpctrain study train``: training throughput under weak or strong scaling, per algorithm,
against DDP.

Weak scaling (default): the batch per rank is fixed, so the global batch grows with p and an
epoch of the data set takes ceil(N / (batch × p)) steps. Strong scaling (``--strong
--global-batch B``): the global batch is fixed and split over the ranks, B / p per rank, so
every p takes the same steps on the same global batches and only the time per step can
change: less compute per rank, the same gradient bytes to reduce. For every rank count and
every ``--allreduce`` name the study launches one MPI job (:mod:`.launcher`): ``hpctrain
train --allreduce NAME``, or for ``ddp`` the PyTorch ``DistributedDataParallel`` baseline
(:mod:`.ddp`) on the same model, data, batches and optimizer. It reads the run's
``metrics.csv``; the first epoch is warm-up (reported apart), the rest is measured:
samples/s = Σ samples / Σ epoch time over the measured epochs, with train's definition of
both (every rank's training samples, the slowest rank's time). With ``--rounds N`` every
point runs N times, the algorithms' order rotated, and the best round stands for it. Scaling
efficiency at p is samples/s(p) / (p · samples/s(1)) of the same algorithm. The report
folder holds ``train.json`` (every point and every epoch of every run),
``samples_per_s_vs_p.png``, ``efficiency_vs_p.png``, ``summary.md`` and ``runs/`` (each
run's directory and log). ``--tensorboard DIR``: every run writes its TensorBoard event
files (``hpctrain train --tensorboard``) into ``DIR/ALGO-pP-rR``, so that ``tensorboard
--logdir DIR`` shows the runs side by side.
"""

import csv
import math
import os
import statistics
import sys
import time

from .. import collectives
from ..bench import report
from ..data.atomic import write_text
from ..errors import UsageError
from ..train import tensorboard
from ..train.config import ALLREDUCE
from . import launcher, plots
from .sweep import machine_lines, rank_counts, say

#: The PyTorch DistributedDataParallel baseline's name among the ``--allreduce`` names.
DDP = "ddp"


def run(args):
    """Run the whole study (``args``: a :class:`~.config.TrainStudy`'s fields, defaults and
    ranges included, and ``given``: those the command line gave); return 0 (a failed launch
    raises with its output)."""
    ranks, algos = _rank_counts(args.np), algorithms(args.allreduce)
    if "allreduce" not in args.given:
        # Horovod leaves the default lists where it is not installed.
        algos = [a for a in algos if a != "horovod" or "horovod" in collectives.available()]
    check_batches(args, ranks)
    if args.tensorboard:
        tensorboard.check(args.tensorboard)
    bad = [item for item in args.set if "=" not in item]
    if bad:
        raise UsageError(f"--set takes KEY=VALUE (a key of `hpctrain train --help`), got {bad}")
    cores = os.cpu_count() or 1
    os.makedirs(args.out, exist_ok=True)
    started = time.monotonic()
    histories = {}
    for round_ in range(args.rounds):
        # Rotate the algorithms' order each round, so that none always runs first or last
        # while the machine's load drifts.
        order = algos[round_ % len(algos):] + algos[:round_ % len(algos)]
        for p in ranks:
            for algo in order:
                say(f"round {round_ + 1}/{args.rounds}: {algo} at {p} rank(s)"
                    f"{' (oversubscribed)' if p > cores else ''}")
                histories.setdefault((algo, p), []).append(_launch(args, algo, p, round_))
    rows = scaling_rows(histories, cores)
    for row in rows:
        row["batch_per_rank"] = batch_per_rank(args, row["np"])
    write_outputs(args, rows, histories, cores)
    say(f"report in {args.out} ({time.monotonic() - started:.0f} s)")
    return 0


def check_batches(args, ranks):
    """``UsageError`` unless the batch options make sense for ``ranks``: with ``--strong``,
    a ``--global-batch`` that every rank count divides (and no ``--batch-size``)."""
    if not args.strong:
        if args.global_batch is not None:
            raise UsageError("--global-batch is for strong scaling: add --strong (or give "
                             "--batch-size, the batch per rank, for weak scaling)")
        return
    if args.global_batch is None or args.global_batch < 1:
        raise UsageError("--strong splits a fixed global batch over the ranks: give "
                         "--global-batch B (B >= 1, divisible by every --np)")
    if args.batch_size_given:
        raise UsageError("--strong takes the batch per rank from --global-batch / p: drop "
                         "--batch-size")
    uneven = [p for p in ranks if args.global_batch % p]
    if uneven:
        whole = math.lcm(*ranks)
        raise UsageError(f"--global-batch {args.global_batch} does not split evenly over "
                         f"p = {', '.join(map(str, uneven))}: give a multiple of {whole}")


def batch_per_rank(args, p):
    """The batch of one rank at ``p`` ranks: ``--batch-size``, or ``--global-batch`` / p."""
    return args.global_batch // p if args.strong else args.batch_size


def algorithms(text):
    """The ``--allreduce`` names, in the given order; ``UsageError`` for unknown ones."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    valid = (*ALLREDUCE, DDP)
    unknown = [name for name in names if name not in valid]
    if unknown or not names:
        raise UsageError(f"--allreduce: unknown {', '.join(unknown) or 'empty list'}; choose "
                         f"from {', '.join(valid)}")
    return list(dict.fromkeys(names))


def measured(history):
    """One run's figures from its ``metrics.csv`` rows: epoch 1 is warm-up, the rest counts."""
    if len(history) < 2:
        raise RuntimeError("the run stopped within its first (warm-up) epoch: raise --max-steps "
                           "or --epochs so that at least one epoch is measured")
    warm, rest = history[0], history[1:]
    seconds = sum(r["epoch_s"] for r in rest)
    return {"samples_per_s": sum(r["samples"] for r in rest) / seconds,
            "warmup_samples_per_s": warm["samples_per_s"], "measured_epochs": len(rest),
            "steps": sum(int(r["steps"]) for r in rest), "epoch_s": seconds / len(rest),
            "step_s": seconds / max(1, sum(int(r["steps"]) for r in rest)),
            "compute_s": _mean(rest, "compute_s"), "exposed_comm_s": _mean(rest, "exposed_comm_s"),
            "first_epoch_loss": warm["train_loss"], "last_epoch_loss": rest[-1]["train_loss"]}


def scaling_rows(histories, cores):
    """One row per (algorithm, p): the best round, efficiency, and the ratio to DDP.

    The best round, as in docs/training.md: on a shared machine other jobs only ever slow a
    run down, so the fastest round is the one they disturbed least. The median is kept too,
    and the spread of the rounds: (fastest - slowest) / median.
    """
    rows = []
    for (algo, p), runs in sorted(histories.items(), key=lambda item: (item[0][1], item[0][0])):
        figures = [measured(history) for history in runs]
        best = max(figures, key=_speed)
        speeds = [_speed(f) for f in figures]
        median = statistics.median(speeds)
        rows.append({"algo": algo, "np": p, "oversubscribed": int(p > cores),
                     "rounds": len(figures), **best,
                     "median_samples_per_s": median,
                     "spread": (max(speeds) - min(speeds)) / median,
                     "per_rank_samples_per_s": best["samples_per_s"] / p})
    speed = {(r["algo"], r["np"]): r["samples_per_s"] for r in rows}
    for r in rows:
        base, ddp = speed.get((r["algo"], 1)), speed.get((DDP, r["np"]))
        r["efficiency"] = r["samples_per_s"] / (r["np"] * base) if base else math.nan
        r["vs_ddp"] = r["samples_per_s"] / ddp if ddp else math.nan
    return rows


def write_outputs(args, rows, histories, cores):
    """train.json, the two plots and summary.md in ``args.out``."""
    env = report.environment()
    settings = {"model": args.model, "batch_size": args.batch_size,
                "scaling": "strong" if args.strong else "weak",
                "global_batch": args.global_batch if args.strong else None,
                "epochs": args.epochs, "warmup_epochs_skipped": 1, "max_steps": args.max_steps,
                "set": args.set, "rounds": args.rounds, "launcher": args.launcher}
    report.write_json(os.path.join(args.out, "train.json"), _json_safe({
        "settings": settings, "cores": cores, "environment": env, "rows": rows,
        "runs": [{"algo": algo, "np": p, "round": i, "epochs": history}
                 for (algo, p), runs in histories.items() for i, history in enumerate(runs)]}))
    scaling = settings["scaling"]
    plots.throughput_vs_ranks(rows, os.path.join(args.out, "samples_per_s_vs_p.png"), cores,
                              scaling)
    plots.efficiency_vs_ranks(rows, os.path.join(args.out, "efficiency_vs_p.png"), cores,
                              scaling)
    write_text(os.path.join(args.out, "summary.md"), summary(rows, settings, cores, env))


def summary(rows, settings, cores, env):
    """The report's markdown: set-up, method, and one table row per (p, algorithm)."""
    s = settings
    extra = " ".join(f"--{item}" for item in s["set"]) or "none"
    limit = f", at most {s['max_steps']} steps" if s["max_steps"] else ""
    if s["scaling"] == "strong":
        batches = (f"global batch {s['global_batch']} at every p, {s['global_batch']} / p per "
                   f"rank (strong scaling: the same steps at every p)")
    else:
        batches = f"batch {s['batch_size']} per rank (global batch {s['batch_size']} × p)"
    lines = [f"# Training scaling study ({s['scaling']} scaling)", "",
             *machine_lines(cores, env, sorted({r["np"] for r in rows})),
             f"- model {s['model']}, {batches}, {s['epochs']} epochs per run{limit}; "
             f"other training options: {extra}; {s['rounds']} round(s), the best one shown; "
             f"launcher {s['launcher']}",
             "- samples/s: every rank's training samples over the slowest rank's training "
             "time, summed over the epochs after the first (warm-up, shown apart); efficiency: "
             "samples/s at p / (p × samples/s at 1) of the same algorithm; / DDP: samples/s "
             "over PyTorch DDP's (gloo) at the same p.", "",
             "| p | algorithm | batch per rank | samples/s | median of rounds | per rank | "
             "efficiency | / DDP | warm-up epoch samples/s | epoch s | step ms | compute s | "
             "exposed comm s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        star = "*" if r["oversubscribed"] else ""
        lines.append(f"| {r['np']}{star} | {r['algo']} | {r['batch_per_rank']} | "
                     f"{r['samples_per_s']:.0f} | "
                     f"{r['median_samples_per_s']:.0f} | {r['per_rank_samples_per_s']:.0f} | "
                     f"{_fixed(r['efficiency'])} | {_fixed(r['vs_ddp'])} | "
                     f"{r['warmup_samples_per_s']:.0f} | "
                     f"{r['epoch_s']:.3f} | {1000 * r['step_s']:.1f} | "
                     f"{_fixed(r['compute_s'], 3)} | "
                     f"{_fixed(r['exposed_comm_s'], 3)} |")
    lines += ["", "Fastest at each p: " + ", ".join(
        f"p = {p}: {max((r for r in rows if r['np'] == p), key=_speed)['algo']}"
        for p in sorted({r["np"] for r in rows})) + ".", "", *noise_lines(rows),
        "DDP differs from `hpctrain train` in what it does besides the timed steps (no "
        "validation, no checkpoints) and in one thing inside them: train also checks every "
        "step that the loss and gradients are finite (one small allgather). gloo uses TCP "
        "even between ranks of one host, where Open MPI uses shared memory. DDP does not "
        "report its exposed communication (n/a).", ""]
    return "\n".join(lines)


def noise_lines(rows):
    """What this run cannot tell apart: the spread of each point's rounds and, at p = 1,
    the difference between algorithms that run the same code there (nothing is reduced over
    one rank, so only ``horovod`` and ``ddp`` differ): the noise between launches."""
    lines = []
    spreads = [r["spread"] for r in rows if r["rounds"] > 1]
    if spreads:
        lines.append(f"Noise: the rounds of a point spread by {100 * min(spreads):.0f} to "
                     f"{100 * max(spreads):.0f} % ((fastest - slowest) / median).")
    same = {r["algo"]: r["median_samples_per_s"] for r in rows
            if r["np"] == 1 and r["algo"] not in (DDP, "horovod")}
    if len(same) > 1:
        fast, slow = max(same, key=same.get), min(same, key=same.get)
        gap = 100 * (same[fast] / same[slow] - 1)
        lines.append(f"At p = 1 {', '.join(sorted(same))} run the same code (nothing is "
                     f"reduced), yet the median of {fast} is {gap:.0f} % above {slow}'s: "
                     f"differences of that size between algorithms are this run's noise, "
                     f"not theirs.")
    return [*lines, ""] if lines else []


def _launch(args, algo, p, round_):
    name = f"{algo}-p{p}-r{round_ + 1}"
    run_dir = os.path.join(args.out, "runs", name)
    # Each run in a folder of its own under --tensorboard: one TensorBoard shows them all.
    events = ["--tensorboard", os.path.join(args.tensorboard, name)] if args.tensorboard else []
    options = ["--model", args.model, "--batch-size", batch_per_rank(args, p),
               "--epochs", args.epochs,
               "--max-steps", args.max_steps, "--progress", "never", "--checkpoint-every", "0",
               "--run-dir", run_dir, *events, *(f"--{item}" for item in args.set)]
    argv = [sys.executable, "-m", "hpctrain.study.ddp", *map(str, options)] if algo == DDP \
        else launcher.hpctrain("train", "--allreduce", algo, *options)
    output = launcher.run(args.launcher, p, argv, args.launch_timeout)
    write_text(os.path.join(run_dir, "log.txt"), output)
    return read_metrics(os.path.join(run_dir, "metrics.csv"))


def read_metrics(path):
    """The rows of a ``metrics.csv`` as dicts of numbers (empty or ``nan`` cells: NaN)."""
    with open(path, newline="") as f:
        return [{key: float(value) if value else math.nan for key, value in row.items()}
                for row in csv.DictReader(f)]


def _rank_counts(text):
    ranks = rank_counts(text, minimum=1)
    if ranks[0] != 1:
        say("adding p = 1: scaling efficiency is relative to one rank")
        ranks = [1, *ranks]
    return ranks


def _mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


def _speed(row):
    return row["samples_per_s"]


def _fixed(value, digits=2):
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _json_safe(value):
    # NaN is not JSON: write null.
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value
