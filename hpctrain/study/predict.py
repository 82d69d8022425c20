"""Predicted allreduce time and bus bandwidth at scales this machine does not have.

``hpctrain study predict --alpha 1.5us --link 100gbit --gamma-rate 20GB/s`` (or
``--params report/params.json``) prints tables of time and busbw and draws both for p up to
4096 and n up to 1 GiB, ``--ranks-per-node`` ranks to a node (8 by default: 512 nodes × 8
GPUs at p = 4096). They show, among other things, the parameter server's time growing as
2(p-1)·n/b while the ring's stays near 2(p-1)/p·n/b ≈ 2n/b, and, with a two-level model
(``--node-link``, or a study fitted on several nodes), where the hierarchical allreduce
beats the flat ring.
"""

import json
import os

from . import links, plots
from ..collectives import cost
from ..data.atomic import write_text

RANKS = tuple(2 ** k for k in range(1, 13))  # 2 .. 4096
SIZES = (8, 64 << 10, 1 << 20, 64 << 20, 1 << 30)
SHOWN_RANKS = (2, 16, 128, 1024, 4096)
#: Ranks per node of the prediction unless told otherwise (8 GPUs a node).
RANKS_PER_NODE = 8


def prediction_table(params, ranks=RANKS, sizes=SIZES, algos=None,
                     ranks_per_node=RANKS_PER_NODE):
    """Rows {np, nodes, size, algo, time_us, busbw_GBps} of predicted allreduces, ranks
    placed ``ranks_per_node`` to a node; ``algos``: every modelled one by default."""
    rows = []
    for p in ranks:
        nodes = -(-p // ranks_per_node)
        for size in sizes:
            for algo in algos or cost.modelled():
                seconds = cost.predict(algo, size, p, params, nodes)
                rows.append({"np": p, "nodes": nodes, "size": size, "algo": algo,
                             "time_us": seconds * 1e6,
                             "busbw_GBps": links.busbw(size, p, seconds) / 1e9})
    return rows


def prediction_markdown(rows):
    """Markdown: predicted time, then busbw, per algorithm for a few p and every size, and
    how much ps and the ring slow down from the fewest ranks to the most at the largest size.
    """
    algos = sorted({r["algo"] for r in rows})
    index = {(r["np"], r["size"], r["algo"]): r for r in rows}
    ranks = [p for p in sorted({r["np"] for r in rows}) if p in SHOWN_RANKS]
    sizes = sorted({r["size"] for r in rows})
    lines = []
    for key, unit, fmt in (("time_us", "µs", ".4g"), ("busbw_GBps", "GB/s", ".3g")):
        lines += [f"{'Time' if key == 'time_us' else 'Bus bandwidth'} ({unit}):", "",
                  "| p | size | " + " | ".join(algos) + " | fastest |",
                  "|---|---|" + "---|" * (len(algos) + 1)]
        for p in ranks:
            for size in sizes:
                times = {a: index[(p, size, a)]["time_us"] for a in algos}
                fastest = min((a for a in algos if a != "mpi"), key=times.get)
                lines.append(f"| {p} | {_human(size)} | " + " | ".join(
                    f"{index[(p, size, a)][key]:{fmt}}" for a in algos) + f" | {fastest} |")
        lines.append("")
    return "\n".join(lines + [growth_line(rows)])


def growth_line(rows):
    """ps against the ring at the largest size: how much slower at the most ranks than at
    the fewest (2(p-1)·n/b grows with p; 2(p-1)/p·n/b stays below 2n/b)."""
    size, low, high = max(r["size"] for r in rows), min(r["np"] for r in rows), \
        max(r["np"] for r in rows)
    time = {(r["np"], r["algo"]): r["time_us"] for r in rows if r["size"] == size}
    parts = [f"{algo} ×{time[(high, algo)] / time[(low, algo)]:.4g}"
             for algo in ("ps", "ring") if (low, algo) in time and time[(low, algo)] > 0]
    return (f"From p = {low} to p = {high} at {_human(size)}: " + ", ".join(parts) +
            f" (ps: 2(p-1)·n/b, ×{(high - 1) / (low - 1):.4g} in its bytes; ring: "
            f"2(p-1)/p·n/b, ×{(high - 1) / high * low / (low - 1):.3g}).")


def run(args):
    """``study predict``: the tables on stdout, ``prediction.png`` (busbw),
    ``prediction_time.png`` and ``prediction.md``."""
    params, note, per_node = load_params(args)
    rows = prediction_table(params, ranks_per_node=per_node)
    os.makedirs(args.out, exist_ok=True)
    table = prediction_markdown(rows)
    title = (f"α = {params.alpha * 1e6:.3g} µs, 1/β = {1 / params.beta / 1e9:.3g} GB/s, "
             f"1/γ = {1 / params.gamma / 1e9:.3g} GB/s" if params.beta and params.gamma
             else f"α = {params.alpha * 1e6:.3g} µs")
    if params.beta_inter is not None:
        title += (f"; between nodes α' = {params.alpha_inter * 1e6:.3g} µs, "
                  f"1/β' = {1 / params.beta_inter / 1e9:.3g} GB/s")
    title += f"; {per_node} ranks per node" + note
    plots.prediction(rows, os.path.join(args.out, "prediction.png"), title)
    plots.prediction(rows, os.path.join(args.out, "prediction_time.png"), title, "time_us")
    write_text(os.path.join(args.out, "prediction.md"),
               f"# Predicted allreduce times\n\n{title}\n\n{table}\n")
    print(title)
    print(table)
    return 0


def load_params(args):
    """``(Params, note, ranks per node)`` from ``--params FILE`` (a study's params.json) or
    from the link options; the note says when a degenerate fit gave way to the ping-pong
    parameters, as ``--allreduce auto`` does. Ranks per node: ``--ranks-per-node``, else
    the study's, else :data:`RANKS_PER_NODE`."""
    from ..errors import UsageError

    if args.params:
        try:
            with open(args.params) as f:
                profile = json.load(f)
            params = cost.params_of(profile)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--params {args.params}: not a study's params.json ({exc!r})") \
                from None
        per_node = _per_node(getattr(args, "ranks_per_node", 0)
                             or profile.get("ranks_per_node"))
        return params, (" (p2p prior: the fit had no cost per byte)"
                        if cost.degenerate(profile) else ""), per_node
    if not args.link:
        raise UsageError("give --params FILE (from a study) or --link RATE, e.g. "
                         "--link 100gbit --alpha 1.5us")
    try:
        beta = 1 / links.parse_rate(args.link)
        gamma = 1 / links.parse_rate(args.gamma_rate)
        node_link = getattr(args, "node_link", None)
        node_beta = 1 / links.parse_rate(node_link) if node_link else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    alpha, per_node = _seconds(args.alpha), _per_node(getattr(args, "ranks_per_node", 0))
    if node_beta is None:
        return cost.Params(alpha, beta, gamma), "", per_node
    # Two levels: --alpha and --link between nodes, --node-alpha and --node-link inside.
    return (cost.Params(_seconds(getattr(args, "node_alpha", "0.5us")), node_beta, gamma, alpha,
                        beta), "", per_node)


def _per_node(value):
    from ..errors import UsageError

    value = RANKS_PER_NODE if value is None or value == 0 else value
    if not isinstance(value, int) or value < 1:
        raise UsageError(f"--ranks-per-node must be a whole number >= 1, got {value!r}")
    return value


def _seconds(text):
    from ..errors import UsageError

    try:
        return links.parse_latency(text)
    except ValueError:
        raise UsageError(f"invalid time {text!r}: expected e.g. 1.5us, 800ns or 2ms") from None


def _human(size):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"
