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

This module is the command: its options read into figures, and the run. The planner is
:mod:`.planner`, the report :mod:`.plan_report`, Horovod's published benchmark
:mod:`.horovod_published`. The step model is :mod:`.step`; the links :mod:`.links`; the
terms' inputs :mod:`.overheads`, each term not given at its default range
(:mod:`.defaults`: no silent zero); with ``--band``, the input that widens the band most, in
words. Nothing here runs MPI or a model's arithmetic: the architectures are built on the
meta device (:mod:`.architectures`).
"""

import functools
import json
import os
from dataclasses import asdict, replace
from typing import NamedTuple

from ..collectives import cost
from ..data.atomic import write_json, write_text
from ..errors import UsageError
from . import defaults as defaults_mod
from . import links
from .overheads import FRAMEWORK_TERMS, Figure, Overheads, exact, figure
from .plan_report import summary, write_hdf5, write_plots
from .planner import (FLIP, best, cycle_ms, label, links_cluster, model_builder, model_layers, plan,
                      rank_counts, solved, strong, strong_counts, uncertain_inputs, widest,
                      banded)
from .step import POLICIES, Cluster


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
            ("--negotiation-rank-us", "rank_s", "0.3:0:1", 0.0),
            ("--framework-us", FRAMEWORK_TERMS, "30:19:48", 0.0)):
        text = getattr(args, option[2:].replace("-", "_"))
        if text is None:
            continue
        value = figure(text, option, example, minimum)
        scale = 1e-3 if option.endswith("-ms") else 1e-6 if option.endswith("-us") else 1.0
        # --framework-us is the framework the user runs: it stands for every policy's.
        for name in (key,) if isinstance(key, str) else key:
            given[name] = Figure(value.value * scale, value.low * scale, value.high * scale,
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


class Given(NamedTuple):
    """The options of ``study plan`` read and checked, before any measuring or predicting."""

    rate: object           # one device's samples/s (a Figure), None with --measure-compute
    shape: tuple           # one sample's shape
    layers: list
    cluster_at: object     # cluster_of's function of the links' ends
    counts: list           # the rank counts of the plan
    defaults: object       # the terms' default ranges (a defaults.Defaults)
    nvlink: bool           # reductions inside a node run over NVLink
    algos: list
    policies: list


def run(args):
    """``study plan``: the tables on stdout, and summary.md, plan.json and plots in --out."""
    given = read_options(args)
    measured, rate = None, given.rate
    if args.measure_compute:
        from . import compute

        build, _ = model_builder(args.model, given.shape)
        measured = compute.measure(build(), given.shape, args.batch, args.measure_steps,
                                   beside=True)
        rate = exact(args.batch / (measured.forward_s + measured.backward_s), "measured here")
    overheads = overheads_of(args, given.counts, measured, given.defaults, given.nvlink)
    cluster_at = given.cluster_at
    uncertain = overheads.uncertain or rate.uncertain or cluster_at("low") != cluster_at("high")
    if args.band and not uncertain:
        raise UsageError("--band needs an uncertainty: give a figure as VALUE:LOW:HIGH, e.g. "
                         "--spread 0.02:0.01:0.04, or a link preset (its range), e.g. "
                         "--inter 100gbe")
    rows, strong_rows, spans, overheads = predicted(args, given, rate, overheads, measured)
    text = _write(args, given, rows, strong_rows, spans, rate, overheads, measured)
    print(text)
    return 0


def read_options(args):
    """The :class:`Given` of the options, every one checked (``UsageError`` naming the bad
    one), in the order the command has always checked them."""
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
    nvlink = not args.params and links.of_options(args)[0].name.startswith("nvlink")
    overheads_of(args, counts)             # bad figures are refused before any measuring
    cycle_ms(args.cycle_ms)
    algos = _names(args.algos, cost.modelled(), "--algos")
    policies = _names(args.policies, POLICIES, "--policies")
    if args.global_batch is not None:
        strong_counts(args.global_batch, args.batch)
    return Given(rate, shape, layers, cluster_at, counts, defaults, nvlink, algos, policies)


def predicted(args, given, rate, overheads, measured):
    """``(rows, strong rows, spans, overheads at their values)``: every point of the plan
    (weak scaling, and strong with ``--global-batch``), banded with ``--band``, and then
    :func:`.planner.widest`'s spans of the best choice at the largest p."""
    layers, cluster_at, algos, policies = given.layers, given.cluster_at, given.algos, \
        given.policies
    options = ([float(x) for x in args.bucket_mb.split(",")], args.fusion_mb,
               cycle_ms(args.cycle_ms), measured)
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
        names = uncertain_inputs(overheads, rate, *(() if args.params else links.of_options(args)))
        spans = widest(lambda ends: efficiency_at(ends, top), names)
    return rows, strong_rows, spans, inputs_at("point")


def _write(args, given, rows, strong_rows, spans, rate, overheads, measured):
    """summary.md, plan.json, plan.h5 and the plots in ``--out``; returns the summary."""
    cluster, layers = given.cluster_at("point"), given.layers
    os.makedirs(args.out, exist_ok=True)
    text = summary(rows, args, cluster, layers, rate, measured, overheads, strong_rows, spans)
    write_text(os.path.join(args.out, "summary.md"), text)
    inputs = {"model": args.model, "input": given.shape, "batch": args.batch,
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
    write_plots(rows, args.out)
    return text


def _link_figures(args):
    if args.params:
        return None
    return [asdict(link) for link in links.of_options(args)]


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
    intra, inter = links.of_options(args)
    if not args.link_efficiency > 0:
        raise UsageError(f"--link-efficiency {args.link_efficiency:g}: give a share above 0, "
                         f"e.g. --link-efficiency 0.9")

    def at(end, inter_end=None):
        return links_cluster(args.ranks_per_node, intra.at(end), inter.at(inter_end or end),
                             adapters=args.adapters, reduce_rate=args.reduce_rate * 1e9,
                             efficiency=args.link_efficiency)
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
