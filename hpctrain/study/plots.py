"""The study's figures, drawn with matplotlib's Agg backend (no display needed)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

from ..collectives import cost  # noqa: E402
from ..data.atomic import atomic_path  # noqa: E402


def busbw_vs_size(rows, ranks, path, cores):
    """busbw against message size, one line per algorithm, for one rank count; hollow
    markers if ``ranks`` > ``cores`` (oversubscribed)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, algo in enumerate(_algos(rows)):
        mine = sorted((r["size"], r["busbw_GBps"]) for r in rows
                      if r["algo"] == algo and r["np"] == ranks and r["size"] > 0)
        if mine:
            ax.plot(*zip(*mine), marker="o", label=algo, **_marker(index, ranks > cores))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    note = " (oversubscribed: hollow markers)" if ranks > cores else ""
    ax.set_title(f"allreduce busbw, p = {ranks} on {cores} cores{note}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def time_vs_ranks(rows, size, params, path, cores, ranks_per_node=0, **options):
    """Measured time (markers, hollow where p > ``cores``) and the model's prediction (lines)
    against p at one size."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, algo in enumerate(_algos(rows)):
        mine = sorted((r["np"], r["time_median_us"]) for r in rows
                      if r["algo"] == algo and r["size"] == size)
        if not mine:
            continue
        for p, value in mine:
            ax.plot(p, value, "o", label=f"{algo} measured" if p == mine[0][0] else None,
                    **_marker(index, p > cores))
        if algo in cost.modelled():
            ranks = [p for p, _ in mine]
            model = [cost.predict(algo, size, p, params,
                                  -(-p // ranks_per_node) if ranks_per_node else 1,
                                  **options) * 1e6 for p in ranks]
            ax.plot(ranks, model, "-", color=f"C{index % 10}", alpha=0.7,
                    label=f"{algo} model")
    every = sorted({r["np"] for r in rows})
    _shade_oversubscribed(ax, every, cores)
    ax.set_xticks(every, [str(p) for p in every])
    ax.set_xlabel("ranks p")
    ax.set_ylabel("time (µs)")
    ax.set_yscale("log")
    ax.set_title(f"allreduce of {size} bytes on {cores} cores: measured vs α-β-γ model")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    save(fig, path)


LABELS = {"busbw_GBps": "predicted busbw (GB/s)", "time_us": "predicted time (µs)"}


def prediction(table, path, title, key="busbw_GBps"):
    """Predicted ``key`` (busbw or time) against p for each algorithm and size, from
    ``prediction_table``: one panel per size."""
    sizes = sorted({row["size"] for row in table})
    fig, axes = plt.subplots(1, len(sizes), figsize=(4 * len(sizes), 4), sharey=False)
    axes = axes if len(sizes) > 1 else [axes]
    for ax, size in zip(axes, sizes):
        for index, algo in enumerate(sorted({row["algo"] for row in table})):
            mine = sorted((r["np"], r[key]) for r in table
                          if r["algo"] == algo and r["size"] == size)
            # mpi lies on the butterfly and ps-sharded (k = p) on the ring; every other line
            # dashed and drawn on top, so that a line lying on another still shows.
            ax.plot(*zip(*mine), marker="os^vDx"[index % 6], markersize=3,
                    linestyle="--" if index % 2 else "-", zorder=3 if index % 2 else 2,
                    label=algo)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks p")
        ax.set_title(f"n = {_human(size)}")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel(LABELS[key])
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    save(fig, path)


def throughput_vs_ranks(rows, path, cores, scaling="weak"):
    """Training samples/s against p, one line per algorithm (``study train``)."""
    _against_ranks(rows, "samples_per_s", path, cores, ylabel="samples/s (all ranks)",
                   title=f"training throughput, {scaling} scaling")


def efficiency_vs_ranks(rows, path, cores, scaling="weak"):
    """Scaling efficiency against p, one line per algorithm, with the ideal 1 (``study train``)."""
    ax = _against_ranks(rows, "efficiency", None, cores, ylabel="efficiency  S(p) / (p·S(1))",
                        title=f"{scaling}-scaling efficiency")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="ideal")
    ax.legend(fontsize=8)
    save(ax.figure, path)


def _against_ranks(rows, key, path, cores, *, ylabel, title):
    # Hollow markers and a grey band: points with more ranks than cores (oversubscribed).
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, algo in enumerate(_algos(rows)):
        mine = sorted((r["np"], r[key]) for r in rows if r["algo"] == algo)
        ax.plot(*zip(*mine), "-", color=f"C{index % 10}", label=algo)
        for p, value in mine:
            ax.plot(p, value, "o", **_marker(index, p > cores))
    ranks = sorted({r["np"] for r in rows})
    _shade_oversubscribed(ax, ranks, cores)
    if ranks[-1] >= 8 * ranks[0]:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ranks, [str(p) for p in ranks])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("ranks p (batch per rank fixed)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} on {cores} cores")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if path is not None:
        save(fig, path)
    return ax


def _marker(index, oversubscribed):
    # Filled markers measure p cores; hollow ones, ranks taking turns on fewer cores.
    color = f"C{index % 10}"
    return {"color": color, "markerfacecolor": "white" if oversubscribed else color}


def _shade_oversubscribed(ax, ranks, cores):
    if ranks and ranks[-1] > cores:
        ax.axvspan(cores + 0.5, ranks[-1] + 0.5, color="grey", alpha=0.12,
                   label=f"oversubscribed (> {cores} cores)")


def _algos(rows):
    return sorted({r["algo"] for r in rows})


def _human(size):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def save(fig, path):
    """Lay ``fig`` out and write it to ``path`` (its suffix names the format), whole or not
    at all; then close it."""
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=Path(path).suffix[1:], dpi=110)
    finally:
        plt.close(fig)
