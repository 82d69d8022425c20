"""``hpctrain study plan``: predict a data-parallel training step at scale, before buying it.

For a model, a batch per rank, one device's speed and a cluster, the plan predicts at every
rank count up to the one asked for (1 to 4096): compute, exposed communication, what hidden
communication still costs (negotiation, slowdown of backward, tail, stragglers, and the
residual an efficiency measured at a smaller scale leaves), step time,
samples/s and scaling efficiency (weak scaling: samples/s at p over p times one rank's), for
every allreduce algorithm of the cost model (:mod:`hpctrain.collectives.cost`) and every
gradient policy, and names the best choice at each scale; with ``--band``, each figure with
a low and a high from the inputs' stated uncertainty, and a best choice only where the bands
do not overlap; with ``--global-batch``, strong scaling of that batch too.

The step model is :mod:`.step`; the links :mod:`.links`; the terms' inputs
:mod:`.overheads`, each term not given at its default range (:mod:`.defaults`: no silent
zero); with ``--band``, the input that widens the band most, in words. Nothing here runs
MPI or a model's arithmetic: the architectures are built on the meta device
(:mod:`.architectures`).
"""

import functools
import importlib
import json
import math
import os
from dataclasses import asdict, replace

from .. import models
from ..collectives import cost
from ..data.atomic import write_json, write_text
from ..errors import UsageError
from . import architectures, links
from . import defaults as defaults_mod
from .links import at_line
from .overheads import Figure, Overheads, exact, expected_max, figure
from .step import POLICIES, Cluster, gradients, measured_gradients, predict

MAX_RANKS = 4096


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


def links_cluster(ranks_per_node, intra, inter, adapters=1, reduce_rate=100e9,
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


def link_cluster(ranks_per_node, intra, inter, efficiency=1.0, adapters=1,
                 reduce_rate=100e9):
    """:func:`links_cluster` of preset names at their nominal line rates
    (:func:`.links.at_line`, what a simulated fabric is built from)."""
    return links_cluster(ranks_per_node, at_line(intra), at_line(inter), adapters, reduce_rate,
                         efficiency)


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
         fusion_mb=64.0, cycle_ms=1.0, compute=None, overheads=None):
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
           bucket_mbs=(25.0,), fusion_mb=64.0, cycle_ms=1.0, compute=None, overheads=None):
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


#: Each input that can widen a band, in words.
INPUT_WORDS = {"rate": "one device's rate", "intra": "the link inside a node",
               "inter": "the link between nodes", "spread": "the stragglers' spread",
               "slowdown": "the slowdown of backward beside a reduction",
               "slowdown_node": "the slowdown of backward beside a reduction inside a node",
               "update_s": "the update after the last reduction",
               "tensor_s": "the negotiation per tensor", "rank_s": "the negotiation per rank",
               "share": "the residual no term explains",
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
             "measured": "a longer measured run (a tighter --measured-efficiency range)"}


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


# ----- the model -------------------------------------------------------------------------------

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


# ----- Horovod's published benchmark -------------------------------------------------------------

#: Horovod's benchmark (docs/benchmarks.rst, and its README of 2017 for 128 GPUs): scaling
#: efficiency, in %, at 128 and 512 GPUs, 64 images per GPU, 4 Pascal GPUs per server,
#: 25 Gbit/s RoCE between servers.
HOROVOD_PUBLISHED = {"inception_v3": (90, 90), "resnet101": (90, 90), "vgg16": (79, 68)}
#: Horovod's README of August 2017, its two benchmark tables (batch 64, synthetic data): one
#: Pascal GPU's images/s on the 25 Gbit/s RoCE cluster (4 servers x 4 GPUs) and on a 40 Gbit/s
#: one (16 x 4), and the speed-up of "RDMA Horovod (allreduce on GPU with NCCL)" at 16 GPUs on
#: the first, given to a tenth (± 0.05).
HOROVOD_ONE_GPU = {"inception_v3": 134.4, "resnet101": 119.4, "vgg16": 130.9}
HOROVOD_ONE_GPU_40G = {"inception_v3": 148.8, "resnet101": 136.0, "vgg16": 149.6}
HOROVOD_16_GPUS = {"inception_v3": 15.0, "resnet101": 14.6, "vgg16": 13.7}
HOROVOD_16_SOURCE = ("Horovod's README, August 2017: 4 servers x 4 Pascal GPUs, RoCE 25 Gbit/s, "
                     "RDMA Horovod, speed-up {:.1f}x of {:g} images/s")
#: Horovod's background loop of 2017-2018 (v0.9 to v0.13, horovod/tensorflow/mpi_ops.cc,
#: then horovod/common/operations.cc) sleeps 5 ms before each round of negotiation.
HOROVOD_2017_CYCLE_MS = 5.0


def horovod_rate(model):
    """One GPU's images/s for ``model``: the benchmark's cluster's own, up to the same
    README's other Pascal cluster's (the GPU of the 128- and 512-GPU runs is not given)."""
    ours, other = HOROVOD_ONE_GPU[model], HOROVOD_ONE_GPU_40G[model]
    return Figure(ours, min(ours, other), max(ours, other),
                  "Horovod's README, August 2017: the 25 Gbit/s cluster's one GPU, up to the "
                  "40 Gbit/s cluster's")
#: The cluster of that benchmark, one description for every model (docs/studies.md says why):
#: PCIe 3.0 inside a server, 25 GbE with RDMA between servers, at the presets' busbw.
HOROVOD_CLUSTER = {"ranks_per_node": 4, "intra": "pcie3", "inter": "25gbe"}
#: P100: 56 SMs (NVIDIA's P100 whitepaper); NCCL's ring kernel takes one SM per ring, 1 to 4
#: rings assumed (2 the value): backward keeps the rest while a reduction runs beside it.
P100_SMS = 56
#: The inputs of what hidden communication still costs in that benchmark, each with its source
#: (the measured efficiency at 16 GPUs is per model: :func:`horovod_overheads`).
HOROVOD_OVERHEADS = Overheads(
    spread=Figure(0.3 / 139.2, 0.2 / 139.2, 0.4 / 139.2,
                  "one GPU's jitter in tf_cnn_benchmarks, ResNet-50 batch 64: 0.3 (0.2-0.4) "
                  "of 139.2 images/s (tensorflow/benchmarks#63, 2017)"),
    update_s=exact(0.0, "none beyond one GPU's: TensorFlow applies each gradient when it is "
                        "ready, so one GPU's rate holds the update"),
    slowdown=Figure(1 + 2 / P100_SMS, 1 + 1 / P100_SMS, 1 + 4 / P100_SMS,
                    f"NCCL's ring on 2 (1-4, assumed) of the P100's {P100_SMS} SMs"),
    tensor_s=Figure(10e-6, 7e-6, 33e-6,
                    "Horovod 0.28.1 measured here, coordinator path (HOROVOD_CACHE_CAPACITY=0, "
                    "as Horovod negotiated in 2017), 200 tensors at p = 2..4"),
    rank_s=exact(0.0, "no growth with p resolvable at p = 2..4 on 2 shared cores"))
#: The terms in the order the benchmark adds them, with the input each switches on.
TERMS = (("negotiation", ("tensor_s", "rank_s")), ("slowdown", ("slowdown", "slowdown_node")),
         ("tail", ("update_s",)), ("stragglers", ("spread",)),
         ("residual", ("measured", "share")))


def horovod_overheads(model, overheads=HOROVOD_OVERHEADS):
    """``overheads`` with ``model``'s efficiency measured at 16 GPUs on the same cluster."""
    speedup = HOROVOD_16_GPUS[model]
    return replace(overheads, measured_p=16, measured=Figure(
        speedup / 16, (speedup - 0.05) / 16, (speedup + 0.05) / 16,
        HOROVOD_16_SOURCE.format(speedup, HOROVOD_ONE_GPU[model])))


def solved(weak, overheads, choice):
    """``overheads`` with the residual its measured efficiency leaves
    (:meth:`.Overheads.solved`), from ``weak(overheads)``'s row at the measured rank count for
    ``choice``, ``(algorithm, policy)``: the measured run's."""
    if not overheads.calibrated:
        return overheads
    row = next(r for r in weak(replace(overheads, residual=0.0))
               if r["np"] == overheads.measured_p and (r["algo"], r["policy"]) == choice)
    return overheads.solved(row["step_s"], row["compute_s"])


#: The low end of a link known to run RDMA over Ethernet: an untuned RoCE stack (assumed).
UNTUNED_ROCE = 0.8


def horovod_links():
    """The benchmark's links: the presets, RDMA between servers (Horovod's text says RoCE):
    the Ethernet preset's RDMA end as the value, an untuned RoCE stack's as its low."""
    intra, inter = (links.PRESETS[HOROVOD_CLUSTER[k]] for k in ("intra", "inter"))
    return intra, replace(inter, busbw=inter.high, low=UNTUNED_ROCE * inter.line,
                          source=inter.source + f"; RoCE said: {links.RDMA_SHARE:.0%}, "
                                 f"{UNTUNED_ROCE:.0%} (untuned RoCE, assumed) the low end")


def horovod_cluster(end="point"):
    """The benchmark's cluster with its links' busbw at ``end``."""
    intra, inter = (link.at(end) for link in horovod_links())
    return links_cluster(HOROVOD_CLUSTER["ranks_per_node"], intra, inter)


def horovod_benchmark(fusion_mb=64.0, cycle_ms=HOROVOD_2017_CYCLE_MS,
                      overheads=HOROVOD_OVERHEADS):
    """Published against predicted efficiency (%), Horovod's ring and fusion, per model and
    GPU count, term by term: ``stages`` the efficiency with communication alone, then each
    of :data:`TERMS` added in turn; ``low`` and ``high`` the band of the last."""
    names = [name for _, inputs in TERMS for name in inputs]
    out = []
    for model, published in HOROVOD_PUBLISHED.items():
        layers, _ = model_layers(model)
        rate = horovod_rate(model)
        inputs_of_model = horovod_overheads(model, overheads)

        def efficiencies(end, inputs):
            def weak(inputs):
                return plan(layers, 64, rate.at(FLIP[end]), horovod_cluster(end), 512,
                            ["ring"], ["horovod"], fusion_mb=fusion_mb, cycle_ms=cycle_ms,
                            overheads=inputs)
            inputs = solved(weak, inputs, ("ring", "horovod"))
            return {r["np"]: r for r in weak(inputs)}, inputs

        stages, on = [], []
        for term, inputs in (("communication", ()), *TERMS):
            on += inputs
            stages.append((term, *efficiencies("point", inputs_of_model.without(
                *[n for n in names if n not in on]))))
        _, final, point = stages[-1]            # every term on: the prediction
        low, high = (efficiencies(end, inputs_of_model.at(end))[0] for end in ("low", "high"))
        for gpus, figure_ in zip((128, 512), published):
            row = final[gpus]
            predicted = 100 * row["efficiency"]
            out.append({"model": model, "gpus": gpus, "images_per_s_1gpu": asdict(rate),
                        "published": figure_, "predicted": predicted,
                        "difference": predicted - figure_,
                        "low": 100 * low[gpus]["efficiency"],
                        "high": 100 * high[gpus]["efficiency"],
                        "measured_16": 100 * point.measured.value,
                        "predicted_16": 100 * final[16]["efficiency"],
                        "residual": point.residual,
                        "stages": {term: 100 * at[gpus]["efficiency"]
                                   for term, at, _ in stages},
                        **{key: row[key] for key in TERM_KEYS}, "step_s": row["step_s"]})
    return out, horovod_cluster()


# ----- the command -------------------------------------------------------------------------------

#: The step's terms as the rows have them, and how the tables head them.
TERM_KEYS = ("compute_s", "exposed_s", "negotiation_s", "slowdown_s", "tail_s", "straggler_s",
             "residual_s")
TERM_HEADS = ("compute", "exposed", "negotiation", "slowdown", "tail", "stragglers", "residual")


def rate_of(text):
    """The :class:`.overheads.Figure` of ``--samples-per-s VALUE[:LOW:HIGH]``, above 0."""
    rate = figure(text, "--samples-per-s", "400:350:450", source="given (--samples-per-s)")
    if rate.low <= 0:
        raise UsageError(f"--samples-per-s {text!r}: give one device's samples/s above 0, "
                         f"e.g. --samples-per-s 400:350:450")
    return rate


def measured_efficiency(text, counts):
    """``(ranks, efficiency Figure)`` of ``--measured-efficiency P=VALUE[:LOW:HIGH]``: P one of
    the plan's rank counts above 1, the efficiency above 0."""
    example = f"e.g. --measured-efficiency {counts[min(3, len(counts) - 1)]}=0.94:0.93:0.95"
    ranks, sep, value = text.partition("=")
    p = int(ranks) if ranks.strip().isdigit() else 0
    if not sep or p < 2:
        raise UsageError(f"--measured-efficiency {text!r}: give RANKS=EFFICIENCY[:LOW:HIGH] "
                         f"with RANKS above 1, {example}")
    if p not in counts:
        raise UsageError(f"--measured-efficiency {text!r}: {p} ranks is not a point of this "
                         f"plan; give one of {', '.join(map(str, counts[1:]))}, {example}")
    try:
        efficiency = figure(value, "--measured-efficiency", "",
                            source=f"given (--measured-efficiency {text})")
    except UsageError:
        efficiency = None
    if efficiency is None or efficiency.low <= 0:
        raise UsageError(f"--measured-efficiency {text!r}: give an efficiency above 0 as "
                         f"VALUE or VALUE:LOW:HIGH with LOW <= VALUE <= HIGH, {example}")
    return p, efficiency


def overheads_of(args, counts, measured=None, defaults=None, nvlink=False):
    """The :class:`.overheads.Overheads` of the options (``counts``: the plan's rank
    counts): a figure given, else what ``--measure-compute`` measured, else its default range
    (``defaults``, :mod:`.defaults`; ``nvlink``: reductions inside a node run over NVLink)."""
    given = {}
    for option, key, example, minimum in (
            ("--spread", "spread", "0.02:0.01:0.04", 0.0),
            ("--slowdown", "slowdown", "1.05:1.0:1.1", 1.0),
            ("--update-ms", "update_s", "2:1:3", 0.0),
            ("--negotiation-us", "tensor_s", "10:7:33", 0.0),
            ("--negotiation-rank-us", "rank_s", "0.3:0:1", 0.0)):
        text = getattr(args, option[2:].replace("-", "_"))
        if text is None:
            continue
        value = figure(text, option, example, minimum)
        scale = 1e-3 if option.endswith("-ms") else 1e-6 if option.endswith("-us") else 1.0
        given[key] = Figure(value.value * scale, value.low * scale, value.high * scale,
                            f"given ({option})")
    if measured is not None:
        if "spread" not in given and measured.spread is not None:
            given["spread"] = measured.spread
        if "slowdown" not in given and measured.slowdown is not None:
            given["slowdown"] = measured.slowdown
    if "slowdown" in given:                 # one figure given or measured: inside a node too
        given["slowdown_node"] = given["slowdown"]
    if args.measured_efficiency is not None:
        given["measured_p"], given["measured"] = measured_efficiency(args.measured_efficiency,
                                                                     counts)
    base = defaults.overheads(nvlink) if defaults is not None else Overheads()
    return replace(base, **given)


def links_of(args):
    """``(intra, inter)`` :class:`.links.Link` of ``--intra`` and ``--inter``."""
    return links.link(args.intra, "--intra"), links.link(args.inter, "--inter")


def run(args):
    """``study plan``: the tables on stdout, and summary.md, plan.json and plots in --out."""
    if not args.model:
        raise UsageError("give --model (e.g. resnet50), --horovod-benchmark or --against "
                         "TRAIN_DIR")
    if args.ranks_per_node is None:
        args.ranks_per_node = 8
    measuring = args.measure_compute
    if measuring and args.samples_per_s is not None:
        raise UsageError("give either --samples-per-s (one device's rate) or --measure-compute "
                         "(time the model here), not both")
    if not measuring and args.samples_per_s is None:
        raise UsageError("give --samples-per-s (one device's training samples/s at --batch) "
                         "or --measure-compute")
    rate = None if measuring else rate_of(args.samples_per_s)
    shape = _shape(args.input) if args.input else None
    layers, shape = model_layers(args.model, shape)
    cluster_at = cluster_of(args)
    counts = rank_counts(args.ranks, args.ranks_per_node)
    defaults = defaults_mod.load(args.defaults)
    nvlink = not args.params and links_of(args)[0].name.startswith("nvlink")
    overheads_of(args, counts)             # bad figures are refused before any measuring
    algos = _names(args.algos, cost.modelled(), "--algos")
    policies = _names(args.policies, POLICIES, "--policies")
    if args.global_batch is not None:
        strong_counts(args.global_batch, args.batch)
    measured = None
    if measuring:
        from . import compute

        build, _ = model_builder(args.model, shape)
        measured = compute.measure(build(), shape, args.batch, args.measure_steps,
                                   beside=True)
        rate = exact(args.batch / (measured.forward_s + measured.backward_s), "measured here")
    overheads = overheads_of(args, counts, measured, defaults, nvlink)
    uncertain = overheads.uncertain or rate.uncertain or cluster_at("low") != cluster_at("high")
    if args.band and not uncertain:
        raise UsageError("--band needs an uncertainty: give a figure as VALUE:LOW:HIGH, e.g. "
                         "--spread 0.02:0.01:0.04, or a link preset (its range), e.g. "
                         "--inter 100gbe")
    options = ([float(x) for x in args.bucket_mb.split(",")], args.fusion_mb,
               args.cycle_ms or 1.0, measured)
    first = (algos[0], policies[0])

    def weak(end, inputs):
        return plan(layers, args.batch, rate.at(FLIP[end]), cluster_at(end), args.ranks, algos,
                    policies, *options, overheads=inputs)

    def split(end, inputs):
        return strong(layers, args.global_batch, args.batch, rate.at(FLIP[end]),
                      cluster_at(end), algos, policies, *options, overheads=inputs)

    @functools.cache
    def inputs_at(end):             # the residual solved once per end, for weak and strong
        inputs = overheads.at(end) if end != "point" else overheads
        return solved(lambda i: weak(end, i), inputs, first)

    def predict_rows(how):
        def at(end):
            return how(end, inputs_at(end))
        return banded(at) if args.band else at("point")

    rows = predict_rows(weak)
    strong_rows = predict_rows(split) if args.global_batch is not None else []

    def efficiency_at(ends, top):           # one input at an end, the others at their value
        cluster = cluster_at(ends.get("intra", "point"), ends.get("inter", "point"))

        def rows_of(inputs):
            return plan(layers, args.batch, rate.at(FLIP[ends.get("rate", "point")]), cluster,
                        top["np"], algos, policies, *options, overheads=inputs)
        inputs = solved(rows_of, overheads.at_each(ends), first)
        return next(r["efficiency"] for r in rows_of(inputs)
                    if r["np"] == top["np"] and label(r) == label(top))

    spans = []
    if args.band and best(rows)[-1]["np"] > 1:
        top = best(rows)[-1]
        names = uncertain_inputs(overheads, rate, *(() if args.params else links_of(args)))
        spans = widest(lambda ends: efficiency_at(ends, top), names)
    overheads = inputs_at("point")
    cluster = cluster_at("point")
    os.makedirs(args.out, exist_ok=True)
    text = summary(rows, args, cluster, layers, rate, measured, overheads, strong_rows, spans)
    write_text(os.path.join(args.out, "summary.md"), text)
    inputs = {"model": args.model, "input": shape, "batch": args.batch,
              "samples_per_s": rate.value, "samples_per_s_range": [rate.low, rate.high],
              "cluster": cluster.description,
              "links": _link_figures(args), "params": cluster.params.as_dict(),
              "overheads": asdict(overheads),
              "compute": asdict(measured) if measured else None}
    write_json(os.path.join(args.out, "plan.json"),
               {**inputs, "layers": [asdict(layer) for layer in layers], "rows": rows,
                "strong": strong_rows})
    write_hdf5(os.path.join(args.out, "plan.h5"), rows, layers,
               {key: value for key, value in inputs.items()
                if key in ("model", "batch", "samples_per_s", "cluster", "params")})
    _plots(rows, args.out)
    print(text)
    return 0


def _link_figures(args):
    if args.params:
        return None
    return [asdict(link) for link in links_of(args)]


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


def inside_band(row):
    """Whether a published figure, given in whole per cent (± 0.5), meets its band."""
    return row["low"] <= row["published"] + 0.5 and row["published"] - 0.5 <= row["high"]


def read_profile(path):
    """The content of a ``params.json`` of ``study allreduce``; ``UsageError`` if missing."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as exc:
        raise UsageError(f"--params {path}: {exc.strerror}; give the params.json that "
                         f"`study allreduce` wrote") from None
    except ValueError as exc:
        raise UsageError(f"--params {path}: not a study's params.json ({exc!r})") from None


def cluster_of(args):
    """``cluster_at(end, inter_end=None)``: the ``Cluster`` of the options with the links'
    busbw at ``end`` (``"point"``, ``"low"``, ``"high"``; the link between nodes at
    ``inter_end`` where given): ``--params`` fitted by a study (no range), else ``--intra``
    and ``--inter``."""
    if args.params:
        try:
            params = cost.params_of(read_profile(args.params))
        except (KeyError, TypeError, AttributeError) as exc:
            raise UsageError(f"--params {args.params}: not a study's params.json ({exc!r})") \
                from None
        fitted = Cluster(args.ranks_per_node, params,
                         f"{args.ranks_per_node} ranks per node, parameters from {args.params}")
        return lambda end, inter_end=None: fitted
    intra, inter = links_of(args)
    if not args.link_efficiency > 0:
        raise UsageError(f"--link-efficiency {args.link_efficiency:g}: give a share above 0, "
                         f"e.g. --link-efficiency 0.9")

    def at(end, inter_end=None):
        return links_cluster(args.ranks_per_node, intra.at(end), inter.at(inter_end or end),
                             args.adapters, args.reduce_rate * 1e9, args.link_efficiency)
    return at


def _names(text, valid, option):
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        raise UsageError(f"{option}: unknown {', '.join(unknown) or 'empty list'}; choose from "
                         f"{', '.join(valid)}")
    return names


def _shape(text):
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise UsageError(f"--input {text!r}: give one sample's shape as C,H,W, e.g. 3,224,224")
    return shape


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
            ("residual", _residual_text(o))]


def _residual_text(o):
    if not o.calibrated:
        return (f"{o.share.describe(' %', 100)} of compute at every p > 1 ({o.share.source}; "
                f"--measured-efficiency replaces it)")
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
        lines += [f"- link {link.describe()}; {link.source}" for link in links_of(args)]
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


def _plots(rows, out):
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
