"""The planner of ``hpctrain study plan``: a data-parallel training step predicted at every
rank count, for every allreduce algorithm of the cost model and every gradient policy, under
weak scaling (:func:`plan`) and strong (:func:`strong`); each figure's band from its inputs'
ends (:func:`banded`), the input that widens it most (:func:`widest`), the best choice at
each scale (:func:`best`); the model's layers, built on the meta device
(:func:`model_layers`).

The step model is :mod:`.step`; the links :mod:`.links`; the terms' inputs
:mod:`.overheads`. The command (options, files) is :mod:`.plan`, its report
:mod:`.plan_report`, Horovod's published benchmark :mod:`.horovod_published`.
"""

import importlib
from dataclasses import replace

from .. import models
from ..collectives import cost
from ..errors import UsageError
from . import architectures
from .links import at_line
from .step import Cluster, gradients, measured_gradients, predict


MAX_RANKS = 4096
#: Horovod's cycle time today (``HOROVOD_CYCLE_TIME``'s default), ms: ``--cycle-ms``'s default.
CYCLE_MS = 1.0


def rank_counts(largest, ranks_per_node):
    """1, 2, 4, ... up to a node, then whole nodes doubling, up to ``largest``."""
    if not 1 <= largest <= MAX_RANKS:
        raise UsageError(f"--ranks must be between 1 and {MAX_RANKS}, got {largest}")
    if largest > ranks_per_node and largest % ranks_per_node:
        raise UsageError(f"--ranks {largest} is not a whole number of nodes of "
                         f"{ranks_per_node} ranks: give a multiple of {ranks_per_node}")
    counts, p = [], 1
    while p < min(largest, ranks_per_node):
        counts.append(p)
        p *= 2
    p = min(largest, ranks_per_node)
    while p < largest:
        counts.append(p)
        p *= 2
    return sorted(set(counts + [largest]))


def links_cluster(ranks_per_node, intra, inter, *, adapters=1, reduce_rate=100e9,
                  efficiency=1.0):
    """A cluster of two :class:`.links.Link`: the busbw each reaches in practice (times
    ``efficiency``), ``adapters`` between nodes; ``reduce_rate`` (bytes/s) is one rank's
    summing speed."""
    params = cost.Params(intra.latency, 1 / (intra.busbw * efficiency), 1 / reduce_rate,
                         inter.latency, 1 / (inter.busbw * efficiency * adapters))
    share = f", {efficiency:.0%} of their busbw" if efficiency != 1 else ""
    return Cluster(ranks_per_node, params,
                   f"{ranks_per_node} ranks per node on {intra.name}, {adapters} x "
                   f"{inter.name} between nodes{share}, reduction {reduce_rate / 1e9:g} GB/s")


def nominal_cluster(ranks_per_node, intra, inter, *, adapters=1, reduce_rate=100e9,
                    efficiency=1.0):
    """:func:`links_cluster` of preset names at their nominal line rates
    (:func:`.links.at_line`, what a simulated fabric is built from); the same keywords."""
    return links_cluster(ranks_per_node, at_line(intra), at_line(inter), adapters=adapters,
                         reduce_rate=reduce_rate, efficiency=efficiency)


def computed(layers, batch, samples_per_s, measured=None):
    """``(forward s, backward s, gradients)`` of one rank's step at ``batch``: ``measured``
    here (:mod:`.compute`, scaled in proportion to the batch), else one device's
    ``samples_per_s``, a third forward and two thirds backward, spread by multiply-adds."""
    if measured is not None:
        scale = batch / measured.batch
        return (scale * measured.forward_s, scale * measured.backward_s,
                measured_gradients(layers, measured, scale))
    seconds = batch / samples_per_s
    return seconds / 3, 2 * seconds / 3, gradients(layers, 2 * seconds / 3)


def choices(algos, policies, bucket_mbs):
    """Every ``(algorithm, policy, bucket MB)`` to predict (a bucket size only for ours)."""
    return [(algo, policy, mb) for algo in algos for policy in policies
            for mb in (bucket_mbs if policy == "hpctrain" else (None,))]


def _row(grads, forward_s, backward_s, p, batch, cluster, choice, fusion_mb, cycle_ms,
         overheads):
    algo, policy, mb = choice
    row = predict(grads, forward_s, backward_s, p, cluster, algo, policy, mb or 25.0,
                  fusion_mb, cycle_ms, overheads)
    row["batch"] = batch
    row["samples_per_s"] = p * batch / row["step_s"]
    # Against one device computing the same samples: compute over step, weak or strong.
    row["efficiency"] = row["compute_s"] / row["step_s"]
    return row


def plan(layers, batch, samples_per_s, cluster, largest, algos, policies, bucket_mbs=(25.0,),
         fusion_mb=64.0, cycle_ms=CYCLE_MS, compute=None, overheads=None):
    """Every point of the plan under weak scaling (``batch`` per rank at every p), with
    samples/s and efficiency (against one rank); the compute as :func:`computed` has it."""
    forward_s, backward_s, grads = computed(layers, batch, samples_per_s, compute)
    return [_row(grads, forward_s, backward_s, p, batch, cluster, choice, fusion_mb, cycle_ms,
                 overheads)
            for p in rank_counts(largest, cluster.ranks_per_node)
            for choice in choices(algos, policies, bucket_mbs)]


def strong_counts(global_batch, batch):
    """The rank counts that split ``global_batch`` from ``batch`` per rank down to one,
    doubling (1024 from 64: 16, 32, ..., 1024), at most :data:`MAX_RANKS`."""
    if batch < 1 or global_batch < batch or global_batch % batch:
        raise UsageError(f"--global-batch {global_batch}: give a multiple of --batch {batch}, "
                         f"e.g. --global-batch {16 * max(batch, 1)} --batch {max(batch, 1)}")
    counts, p = [], global_batch // batch
    while p <= min(global_batch, MAX_RANKS):
        if global_batch % p == 0:
            counts.append(p)
        p *= 2
    return counts


def strong(layers, global_batch, batch, samples_per_s, cluster, algos, policies,
           bucket_mbs=(25.0,), fusion_mb=64.0, cycle_ms=CYCLE_MS, compute=None, overheads=None):
    """Strong scaling: ``global_batch`` split over p ranks (:func:`strong_counts`), each
    computing global_batch / p samples; efficiency against one device computing them all
    at the same rate per sample."""
    rows = []
    for p in strong_counts(global_batch, batch):
        forward_s, backward_s, grads = computed(layers, global_batch // p, samples_per_s,
                                                compute)
        rows += [_row(grads, forward_s, backward_s, p, global_batch // p, cluster, choice,
                      fusion_mb, cycle_ms, overheads)
                 for choice in choices(algos, policies, bucket_mbs)]
    return rows


#: Which end of an input gives an efficiency's end: a cost's high figure (or a device's
#: high rate, hiding less) the low efficiency.
FLIP = {"low": "high", "high": "low", "point": "point"}


def cycle_ms(given, default=CYCLE_MS):
    """``--cycle-ms``: ``given`` (0 included: negotiations back to back), or ``default``
    where it was not given. ``UsageError`` below 0."""
    if given is None:
        return default
    if not given >= 0:
        raise UsageError(f"--cycle-ms {given:g}: give Horovod's cycle time in ms, 0 or more, "
                         f"e.g. --cycle-ms {default:g}")
    return given


def banded(predict_at):
    """``predict_at(end)`` at the inputs' values (``"point"``), each row with the efficiency
    and samples/s its inputs give at their pessimistic (``_low``) and optimistic (``_high``)
    ends."""
    rows = predict_at("point")
    for end in ("low", "high"):
        for row, other in zip(rows, predict_at(end)):
            row[f"efficiency_{end}"] = other["efficiency"]
            row[f"samples_per_s_{end}"] = other["samples_per_s"]
    return rows


def uncertain_inputs(overheads, rate, intra=None, inter=None):
    """The names of the inputs with a range: ``rate``, ``intra`` and ``inter`` (links, where
    given) and the overheads' figures."""
    names = ["rate"] if rate.uncertain else []
    names += [name for name, link in (("intra", intra), ("inter", inter))
              if link is not None and link.low != link.high]
    names += [name for name in overheads.figure_names() if getattr(overheads, name).uncertain]
    if overheads.calibrated and "measured" not in names:
        names.append("measured")
    return names


def widest(efficiency, names):
    """``[(name, low, high)]``, the widest first: ``efficiency(ends)`` with only ``name`` at
    the band's pessimistic and optimistic end, every other input at its value."""
    spans = [(name, efficiency({name: "low"}), efficiency({name: "high"})) for name in names]
    return sorted(spans, key=lambda span: span[1] - span[2])


def best(rows):
    """The fastest choice at each rank count."""
    chosen = {}
    for row in rows:
        if row["np"] not in chosen or row["samples_per_s"] > chosen[row["np"]]["samples_per_s"]:
            chosen[row["np"]] = row
    return [chosen[p] for p in sorted(chosen)]


def rivals(rows, top):
    """The other choices at ``top``'s rank count whose band reaches ``top``'s: within the
    noise of the inputs (none without a band)."""
    if top["np"] == 1:
        return []                          # nothing to reduce: every choice is the same
    floor = top.get("efficiency_low", top["efficiency"])
    return [row for row in rows if row["np"] == top["np"] and row is not top and
            row.get("efficiency_high", row["efficiency"]) >= floor]


def below_half(rows):
    """The first best row whose efficiency is below 50 % (``None`` if none)."""
    return next((row for row in best(rows) if row["efficiency"] < 0.5), None)


def label(row):
    """How a row's choice reads: algorithm and policy (with its bucket size)."""
    extra = f" {row['bucket_mb']:g} MB" if row.get("bucket_mb") else ""
    return f"{row['algo']} / {row['policy']}{extra}"


def model_builder(spec, sample_shape=None, classes=10, hidden=128, model_mb=16.0):
    """``(build, input shape)``: ``build()`` makes the model on torch's current default
    device, for an architecture name, one of hpctrain's training models (``mlp``, ``cnn``,
    ``wide``: with ``sample_shape``, ``classes`` and their ``hidden`` or ``model_mb``) or
    ``package.module:factory``."""
    if spec in architectures.FACTORIES:
        side = architectures.INPUT[spec]
        return architectures.FACTORIES[spec], (3, side, side)
    if spec not in models.MODELS and ":" not in spec:
        raise UsageError(f"unknown model {spec!r}: give one of "
                         f"{', '.join((*architectures.FACTORIES, *models.MODELS))} or "
                         f"package.module:factory")
    if not sample_shape:
        raise UsageError(f"--model {spec}: give --input C,H,W (one sample's shape)")
    shape = tuple(sample_shape)
    if spec in models.MODELS:
        return (lambda: models.build_model(spec, shape, classes, hidden=hidden,
                                           model_mb=model_mb)), shape
    module, _, name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--model {spec}: cannot load it ({exc})") from None
    return factory, shape


def model_layers(spec, sample_shape=None, **options):
    """``(layers, input shape)`` of :func:`model_builder`'s model, built on the meta device."""
    import torch

    build, shape = model_builder(spec, sample_shape, **options)
    with torch.device("meta"):
        model = build()
    return architectures.layers(model, shape), shape


def solved(weak, overheads, choice):
    """``overheads`` with the residual its measured efficiency leaves
    (:meth:`.Overheads.solved`), from ``weak(overheads)``'s row at the measured rank count for
    ``choice``, ``(algorithm, policy)``: the measured run's."""
    if not overheads.calibrated:
        return overheads
    row = next(r for r in weak(replace(overheads, residual=0.0))
               if r["np"] == overheads.measured_p and (r["algo"], r["policy"]) == choice)
    return overheads.solved(row["step_s"], row["compute_s"])


#: The step's terms as the rows have them (:data:`.plan_report.TERM_HEADS` heads them).
TERM_KEYS = ("compute_s", "exposed_s", "negotiation_s", "framework_s", "slowdown_s", "tail_s",
             "straggler_s", "residual_s")
