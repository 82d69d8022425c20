"""What ``hpctrain study plan`` writes: the markdown summary (inputs with their sources, the
best choice at each scale, the band in words, strong scaling, every point), ``plan.h5``,
the plots, and Horovod's benchmark against the plan (:func:`horovod_markdown`)."""

import math
import os
from dataclasses import asdict

from . import links
from .horovod_published import (HOROVOD_16_GPUS, HOROVOD_ONE_GPU, HOROVOD_OVERHEADS, TERMS,
                                horovod_links, horovod_rate, inside_band)
from .overheads import FRAMEWORK_TERMS, Overheads, expected_max
from .planner import TERM_KEYS, below_half, best, label, rivals
from .step import POLICIES


#: How the tables head the step's terms (:data:`.planner.TERM_KEYS`, in its order).
TERM_HEADS = ("compute", "exposed", "negotiation", "framework", "slowdown", "tail", "stragglers",
              "residual")


#: Each input that can widen a band, in words.
INPUT_WORDS = {"rate": "one device's rate", "intra": "the link inside a node",
               "inter": "the link between nodes", "spread": "the stragglers' spread",
               "slowdown": "the slowdown of backward beside a reduction",
               "slowdown_node": "the slowdown of backward beside a reduction inside a node",
               "update_s": "the update after the last reduction",
               "tensor_s": "the negotiation per tensor", "rank_s": "the negotiation per rank",
               "share": "the residual no term explains",
               "share_node": "the residual no term explains inside a node",
               "framework_ddp": "DDP's own work per step",
               "framework_hpctrain": "hpctrain's own work per step",
               "framework_horovod": "Horovod's own work per step",
               "measured": "the measured efficiency's range"}
#: What narrows each input.
NARROWING = {"rate": "one device's rate measured on it (--samples-per-s VALUE, or "
                     "--measure-compute on that device)",
             "intra": "a busbw measured inside a node (nccl-tests all_reduce_perf, given as "
                      "--intra RATE)",
             "inter": "a busbw measured between two nodes (nccl-tests all_reduce_perf, given "
                      "as --inter RATE)",
             "spread": "a run of --measure-compute on the device (the steps' spread)",
             "slowdown": "a run of --measure-compute on the device (backward beside a "
                         "reduction)",
             "slowdown_node": "a run of --measure-compute on the device (backward beside a "
                              "reduction)",
             "update_s": "--update-ms measured",
             "tensor_s": "--negotiation-us measured with the engine you will run",
             "rank_s": "--negotiation-rank-us measured at two or more scales",
             "share": "a two-node run into --measured-efficiency",
             "share_node": "a two-GPU run into --measured-efficiency",
             **dict.fromkeys(FRAMEWORK_TERMS,
                             "--framework-us from one device's step with and without the "
                             "framework's wrapper"),
             "measured": "a longer measured run (a tighter --measured-efficiency range)"}


def write_hdf5(path, rows, layers, attrs):
    """``plan.h5``: the table ``plan`` (a row per point; ``bucket_mb`` NaN for the policies
    without our buckets) with ``attrs``, ``timeline`` (every point's transfers, keyed by the
    point's row) and ``layers`` (name, bytes, multiply-adds per sample)."""
    from ..bench import report

    def number(value):
        return math.nan if value is None else value

    table = [{key: number(value) for key, value in row.items() if key != "timeline"}
             for row in rows]
    timeline = [{"row": i, "transfer": j, **transfer} for i, row in enumerate(rows)
                for j, transfer in enumerate(row["timeline"])]
    report.write_hdf5(path, "plan", table, {k: v for k, v in attrs.items() if v is not None},
                      {"timeline": timeline, "layers": [asdict(layer) for layer in layers]})


def horovod_markdown(rows, cluster, fusion_mb, cycle_ms, overheads=HOROVOD_OVERHEADS):
    """The benchmark's markdown: inputs with their sources, then published against
    predicted, term by term, with the band."""
    intra, inter = horovod_links()
    terms = ["communication", *(term for term, _ in TERMS)]
    lines = ["## With the 16-GPU measurement (--measured-efficiency)", "",
             f"- cluster: {cluster.description}; Horovod's ring, fusion {fusion_mb:g} MB, "
             f"cycle {cycle_ms:g} ms; 64 images per GPU",
             f"- inside a server: {intra.describe()} ({intra.source})",
             f"- between servers: {inter.describe()} ({inter.source})",
             "- one GPU: " + ", ".join(f"{model} {horovod_rate(model).describe()}"
                                       for model in HOROVOD_ONE_GPU) +
             f" images/s ({horovod_rate('vgg16').source})"]
    lines += [f"- {head}: {text}" for head, text in _overhead_lines(overheads)
              if head != "residual"]
    lines += [f"- residual, {r['model']}: {r['measured_16']:.1f} % measured at 16 GPUs "
              f"({HOROVOD_16_GPUS[r['model']]:.1f}x) leaves {100 * r['residual']:.1f} % of "
              f"compute that no term above explains there"
              for r in rows if r["gpus"] == 128]
    lines += ["", "| model | GPUs | published % | " +
              " | ".join(f"+ {t}" if i else t for i, t in enumerate(terms)) +
              " | band % | difference | in band |",
              "|---|---:|---:|" + "---:|" * len(terms) + "---|---:|---|"]
    for r in rows:
        inside = "yes" if inside_band(r) else "no"
        lines.append(f"| {r['model']} | {r['gpus']} | {r['published']} | " +
                     " | ".join(f"{r['stages'][t]:.1f}" for t in terms) +
                     f" | {r['low']:.1f}-{r['high']:.1f} | {r['difference']:+.1f} | {inside} |")
    signed = sum(r["difference"] for r in rows) / len(rows)
    lines += ["", f"Mean signed error {signed:+.1f} points; largest "
              f"{max(abs(r['difference']) for r in rows):.1f}; "
              f"{sum(map(inside_band, rows))} of {len(rows)} published figures inside their "
              f"band (a published whole per cent stands for ± 0.5)."]
    return "\n".join(lines) + "\n"


def _overhead_lines(overheads):
    """``(term, its input and source)`` for every term of what hidden communication costs."""
    o = overheads
    return [("stragglers", f"spread of one rank's step {o.spread.describe(' %', 100)} "
                           f"({o.spread.source}): the slowest of p is E[max] = "
                           f"{expected_max(128):.2f} σ later at p = 128, "
                           f"{expected_max(512):.2f} σ at 512"),
            ("tail", f"update after the last reduction {o.update_s.describe(' ms', 1e3)} "
                     f"({o.update_s.source}); the last reduction's own time is in exposed"),
            ("slowdown", f"backward x {o.slowdown.describe()} while a reduction between "
                         f"nodes runs beside it ({o.slowdown.source}); x "
                         f"{o.slowdown_node.describe()} where every reduction stays inside a "
                         f"node ({o.slowdown_node.source})"),
            ("negotiation", f"{o.tensor_s.describe(' µs', 1e6)} per negotiated tensor "
                            f"({o.tensor_s.source}) + {o.rank_s.describe(' µs', 1e6)} per "
                            f"rank ({o.rank_s.source})"),
            ("framework", "per gradient and step at p > 1: " + "; ".join(
                f"{policy} {o.framework_at(policy).describe(' µs', 1e6)} "
                f"({o.framework_at(policy).source})" for policy in POLICIES)),
            ("residual", _residual_text(o))]


def _residual_text(o):
    if not o.calibrated and o.share_node == o.share:
        return (f"{o.share.describe(' %', 100)} of compute at every p > 1 ({o.share.source}; "
                f"--measured-efficiency replaces it)")
    if not o.calibrated:
        return (f"{o.share.describe(' %', 100)} of compute at every p > 1 whose reductions "
                f"leave the node ({o.share.source}); {o.share_node.describe(' %', 100)} where "
                f"every reduction stays inside a node ({o.share_node.source}); "
                f"--measured-efficiency replaces both")
    return (f"efficiency {o.measured.describe(' %', 100)} measured at {o.measured_p} ranks "
            f"({o.measured.source}) leaves {100 * o.residual:.1f} % of compute that no term "
            f"above explains there; carried to every p > 1 halfway between staying and "
            f"growing as the slowest of p (the band's ends)")


def choice_text(row, rows):
    """A best row's choice, or it and its rivals "within the noise"."""
    others = rivals(rows, row)
    if not others:
        return label(row)
    names = [label(row)] + sorted({label(r) for r in others} - {label(row)})
    shown = " or ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")
    return f"{shown}: within the noise"


def _efficiency(row):
    if "efficiency_low" not in row:
        return f"{row['efficiency']:.3f}"
    return f"{row['efficiency']:.3f} ({row['efficiency_low']:.3f}-{row['efficiency_high']:.3f})"


def _terms_ms(row):
    return " | ".join(f"{1000 * row[key]:.1f}" for key in TERM_KEYS)


def _table(rows, first="p", extra=lambda row: ""):
    heads = " | ".join(f"{h} ms" for h in TERM_HEADS)
    lines = [f"| {first} | choice | samples/s | efficiency | step ms | {heads} |",
             "|---:|---|---:|---:|---:|" + "---:|" * len(TERM_HEADS)]
    for row in best(rows):
        lines.append(f"| {row['np']}{extra(row)} | {choice_text(row, rows)} | "
                     f"{row['samples_per_s']:.0f} | {_efficiency(row)} | "
                     f"{1000 * row['step_s']:.1f} | {_terms_ms(row)} |")
    return lines


def band_text(row, spans):
    """In words, what the band of the best ``row`` at the largest p is and which input widens
    it most (``spans``: :func:`widest`'s, in fractions), and what narrows that input."""
    low, high = 100 * row["efficiency_low"], 100 * row["efficiency_high"]
    text = f"At p = {row['np']} ({label(row)}) the efficiency lies between {low:.0f} and " \
           f"{high:.0f} %"
    if not spans or spans[0][2] - spans[0][1] <= 0:
        return text + "."
    (name, a, b), rest = spans[0], [span for span in spans[1:] if span[2] - span[1] > 5e-4]
    text += (f": mostly {INPUT_WORDS[name]} ({100 * a:.1f}-{100 * b:.1f} % with it alone at "
             f"its ends), which {NARROWING[name]} narrows")
    if rest:
        text += "; then " + ", ".join(f"{INPUT_WORDS[n]} ({100 * (y - x):.1f} points)"
                                      for n, x, y in rest[:3])
    return text + "."


def summary(rows, args, cluster, layers, rate, measured=None, overheads=None, strong_rows=(),
            spans=()):
    """The plan's markdown: inputs (every term's with its source, the link figures used),
    the best choice per rank count with its terms and what widens the band most, strong
    scaling, then every point."""
    overheads = overheads or Overheads()
    nbytes = sum(layer.nbytes for layer in layers)
    if measured:
        compute = (f"- batch {args.batch} per rank; compute measured here (median of "
                   f"{measured.steps} steps): forward {1000 * measured.forward_s:.1f} ms, "
                   f"backward {1000 * measured.backward_s:.1f} ms ({rate.value:.1f} "
                   f"samples/s), each gradient ready when this backward had it")
    else:
        compute = (f"- batch {args.batch} per rank; one device {rate.describe()} samples/s, "
                   f"so a step computes {1000 * args.batch / rate.value:.1f} ms (1/3 "
                   f"forward, 2/3 backward)")
    lines = ["# Training plan", "",
             f"- model {args.model}: {len(layers)} layers with parameters, "
             f"{nbytes / 1e6:.1f} MB of float32 gradients, "
             f"{sum(layer.macs for layer in layers) / 1e9:.2f} G multiply-adds per sample",
             compute, f"- cluster: {cluster.description}"]
    if not args.params:
        lines += [f"- link {link.describe()}; {link.source}" for link in links.of_options(args)]
    lines += [f"- {term}: {text}" for term, text in _overhead_lines(overheads)]
    if args.band:
        lines.append("- efficiency (low-high): the inputs at their pessimistic and optimistic "
                     "ends; a best choice only where no other's band reaches it")
    lines += ["", "## Best choice at each scale", "", *_table(rows)]
    if args.band and best(rows)[-1]["np"] > 1:
        lines += ["", band_text(best(rows)[-1], spans)]
    if strong_rows:
        lines += ["", f"## Strong scaling: a global batch of {args.global_batch}", "",
                  *_table(strong_rows, extra=lambda r: f" x {r['batch']}")]
        half = below_half(strong_rows)
        lines += ["", f"Efficiency falls below 50 % at p = {half['np']} ({half['batch']} per "
                      f"rank): {_efficiency(half)}." if half else
                  "Efficiency stays at or above 50 % at every split."]
    heads = " | ".join(f"{h} ms" for h in TERM_HEADS)
    lines += ["", "## Every point", "",
              f"| p | choice | samples/s | efficiency | step ms | {heads} | comm ms |",
              "|---:|---|---:|---:|---:|" + "---:|" * (len(TERM_HEADS) + 1)]
    lines += [f"| {r['np']} | {label(r)} | {r['samples_per_s']:.0f} | {_efficiency(r)} | "
              f"{1000 * r['step_s']:.1f} | {_terms_ms(r)} | {1000 * r['comm_s']:.1f} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def write_plots(rows, out):
    """``plan.png`` (efficiency and samples/s against p, every choice) and ``timeline.png``
    (the best choice's reductions beside backward at the largest p) in ``out``."""
    import matplotlib.pyplot as plt

    from . import plots   # chooses matplotlib's Agg backend

    choices_ = sorted({label(r) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for choice in choices_:
        mine = [r for r in rows if label(r) == choice]
        for ax, key in zip(axes, ("efficiency", "samples_per_s")):
            ax.plot([r["np"] for r in mine], [r[key] for r in mine], marker="o", ms=3,
                    label=choice)
            if f"{key}_low" in mine[0]:
                ax.fill_between([r["np"] for r in mine], [r[f"{key}_low"] for r in mine],
                                [r[f"{key}_high"] for r in mine], alpha=0.15)
    for ax, key in zip(axes, ("scaling efficiency", "samples/s (all ranks)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks p")
        ax.set_ylabel(key)
        ax.grid(True, alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    plots.save(fig, os.path.join(out, "plan.png"))
    top = best(rows)[-1]
    fig, ax = plt.subplots(figsize=(9, 2.6))
    compute = top["compute_s"]
    ax.barh(1, compute * 2 / 3, left=compute / 3, color="tab:blue", label="backward")
    for t in top["timeline"]:
        ax.barh(0, t["end"] - t["start"], left=compute / 3 + t["start"], color="tab:orange",
                edgecolor="k", linewidth=0.3)
    ax.set_yticks([0, 1], ["reductions", "backward"])
    ax.set_xlabel("seconds into the step")
    ax.set_title(f"p = {top['np']}, {label(top)}: step {1000 * top['step_s']:.1f} ms, exposed "
                 f"{1000 * top['exposed_s']:.1f} ms")
    plots.save(fig, os.path.join(out, "timeline.png"))
