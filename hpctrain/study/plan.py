"""``hpctrain study plan``: predict a data-parallel training step at scale, before buying it.

For a model, a batch per rank, one device's speed and a cluster, the plan predicts at every
rank count up to the one asked for (1 to 4096): compute, exposed communication, step time,
samples/s and scaling efficiency (weak scaling: samples/s at p over p times one rank's), for
every allreduce algorithm of the cost model (:mod:`hpctrain.collectives.cost`) and every
gradient policy, and names the best choice at each scale.

The step's schedule is the one a data-parallel optimizer runs:

- **compute**: one device's samples/s gives a step of ``batch / rate`` seconds, a third
  forward and two thirds backward (backward computes two products per forward one); backward
  reaches the layers in the reverse of the order forward reached them, spending on each a
  share of its time in proportion to the layer's multiply-adds;
- **gradients** are ready when backward has passed their layer; a **policy** groups them:
  ``hpctrain`` (our ``DistributedOptimizer``: buckets of ``--bucket-mb``, cut in backward
  order), ``ddp`` (PyTorch's: 25 MB buckets, the first one 1 MB) or ``horovod`` (a tensor
  per layer; every cycle, everything ready is fused up to the fusion buffer's size);
- **one communication channel** reduces the groups in order, each as soon as it is ready and
  the channel is free, in the time the cost model gives for its bytes;
- what the channel has not finished when backward ends is **exposed**: step = forward +
  backward + exposed.

Nothing here runs MPI or a model's arithmetic: the architectures are built on the meta device
(:mod:`.architectures`).
"""

import importlib
import json
import math
import os
from dataclasses import asdict, dataclass

from .. import models
from ..collectives import cost
from ..errors import UsageError
from . import architectures

#: Links by name: (latency s, bandwidth bytes/s), nominal rates (see docs/studies.md).
LINKS = {"nvlink": (2e-6, 150e9), "pcie": (5e-6, 12e9), "10gbe": (25e-6, 1.25e9),
         "25gbe": (10e-6, 3.125e9), "100gbe": (5e-6, 12.5e9), "ib-edr": (1.5e-6, 12.5e9),
         "ib-hdr": (1.5e-6, 25e9)}
POLICIES = ("hpctrain", "ddp", "horovod")
MAX_RANKS = 4096
DDP_BUCKET, DDP_FIRST = 25 * 2**20, 1 * 2**20


@dataclass(frozen=True)
class Gradient:
    """A layer's gradient: its bytes and when backward has it ready (s after backward starts)."""

    name: str
    nbytes: int
    ready: float


@dataclass(frozen=True)
class Transfer:
    """One reduction on the channel: its bytes, when its data was ready, start and end."""

    nbytes: int
    ready: float
    start: float
    end: float


def gradients(layers, backward_s):
    """The layers' gradients in backward order, each ready when backward has passed its
    layer, backward's time shared in proportion to the layers' multiply-adds."""
    total = sum(layer.macs for layer in layers) or 1.0
    clock, out = 0.0, []
    for layer in reversed(layers):
        clock += backward_s * layer.macs / total
        out.append(Gradient(layer.name, layer.nbytes, clock))
    return out


def buckets(grads, bucket_bytes, first_bytes=None):
    """``(nbytes, ready)`` per bucket, cut in backward order as our ``assign_buckets`` cuts
    them: a bucket closes when the next gradient would take it past ``bucket_bytes`` (the
    first one past ``first_bytes``, DDP's small first bucket); a larger gradient is alone."""
    out, size, ready = [], 0, 0.0
    for grad in grads:
        cap = first_bytes if first_bytes is not None and not out else bucket_bytes
        if size and size + grad.nbytes > cap:
            out.append((size, ready))
            size = 0
        size, ready = size + grad.nbytes, grad.ready
    if size:
        out.append((size, ready))
    return out


def in_order(groups, seconds):
    """The channel's transfers of ``groups`` (``(nbytes, ready)``), in order, each starting
    when ready and the previous one has ended; ``seconds(nbytes)`` is one reduction's time."""
    out, free = [], 0.0
    for nbytes, ready in groups:
        start = max(ready, free)
        free = start + seconds(nbytes)
        out.append(Transfer(nbytes, ready, start, free))
    return out


def fused(grads, fusion_bytes, cycle_s, seconds):
    """Horovod's schedule: at each cycle tick when the channel is free, everything ready by
    then (in backward order) is fused into one reduction, up to ``fusion_bytes``."""
    out, free, index = [], 0.0, 0
    while index < len(grads):
        tick = max(free, grads[index].ready)
        tick = math.ceil(tick / cycle_s - 1e-9) * cycle_s if cycle_s > 0 else tick
        size, ready = 0, 0.0
        while index < len(grads) and grads[index].ready <= tick + 1e-12 and \
                (size == 0 or size + grads[index].nbytes <= fusion_bytes):
            size, ready = size + grads[index].nbytes, grads[index].ready
            index += 1
        free = tick + seconds(size)
        out.append(Transfer(size, ready, tick, free))
    return out


def step_times(forward_s, backward_s, transfers):
    """``(step s, exposed s)``: forward, backward, and what the channel has left after it."""
    last = max((t.end for t in transfers), default=0.0)
    exposed = max(0.0, last - backward_s)
    return forward_s + backward_s + exposed, exposed


@dataclass(frozen=True)
class Cluster:
    """``ranks_per_node`` ranks per node; links inside and between nodes as cost parameters."""

    ranks_per_node: int
    params: cost.Params
    description: str


def link_cluster(ranks_per_node, intra, inter, efficiency=1.0, adapters=1,
                 reduce_rate=100e9):
    """A cluster from link names (:data:`LINKS`): ``efficiency`` scales both bandwidths (the
    share of the line rate a transport reaches), ``adapters`` multiplies the bandwidth
    between nodes; ``reduce_rate`` (bytes/s) is one rank's summing speed."""
    for name in (intra, inter):
        if name not in LINKS:
            raise UsageError(f"unknown link {name!r}; presets: {', '.join(LINKS)}")
    (a_in, bw_in), (a_out, bw_out) = LINKS[intra], LINKS[inter]
    params = cost.Params(a_in, 1 / (bw_in * efficiency), 1 / reduce_rate, a_out,
                         1 / (bw_out * efficiency * adapters))
    return Cluster(ranks_per_node, params,
                   f"{ranks_per_node} ranks per node on {intra}, {adapters} x {inter} between "
                   f"nodes, {efficiency:.0%} of line rate, reduction {reduce_rate / 1e9:g} GB/s")


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


def plan_point(grads, forward_s, backward_s, p, cluster, algo, policy, bucket_mb=25.0,
               fusion_mb=64.0, cycle_ms=1.0):
    """One prediction: the step at ``p`` ranks with ``algo`` and ``policy``."""
    nodes = max(1, p // cluster.ranks_per_node)
    options = {"ranks_per_node": min(p, cluster.ranks_per_node)}

    def seconds(nbytes):
        return cost.predict(algo, nbytes, p, cluster.params, nodes, **options)

    if p == 1:
        transfers = []
    elif policy == "horovod":
        transfers = fused(grads, fusion_mb * 2**20, cycle_ms / 1000, seconds)
    elif policy == "ddp":
        transfers = in_order(buckets(grads, DDP_BUCKET, DDP_FIRST), seconds)
    else:
        transfers = in_order(buckets(grads, bucket_mb * 2**20), seconds)
    step, exposed = step_times(forward_s, backward_s, transfers)
    return {"np": p, "nodes": nodes, "algo": algo, "policy": policy,
            "bucket_mb": bucket_mb if policy == "hpctrain" else None,
            "compute_s": forward_s + backward_s, "exposed_s": exposed, "step_s": step,
            "comm_s": sum(t.end - t.start for t in transfers), "transfers": len(transfers),
            "timeline": [asdict(t) for t in transfers]}


def measured_gradients(layers, compute):
    """The layers' gradients in the order a measured backward (:mod:`.compute`) had them
    ready, each at its measured time; a layer that got no gradient, at backward's end."""
    grads = [Gradient(layer.name, layer.nbytes, compute.ready.get(layer.name, compute.backward_s))
             for layer in layers]
    return sorted(grads, key=lambda grad: grad.ready)


def plan(layers, batch, samples_per_s, cluster, largest, algos, policies, bucket_mbs=(25.0,),
         fusion_mb=64.0, cycle_ms=1.0, compute=None):
    """Every point of the plan, with samples/s and efficiency (against one rank). The step's
    compute: ``compute`` measured here (:mod:`.compute`), else one device's ``samples_per_s``
    at ``batch``, a third forward, two thirds backward, spread by multiply-adds."""
    if compute is not None:
        forward_s, backward_s = compute.forward_s, compute.backward_s
        grads = measured_gradients(layers, compute)
    else:
        step = batch / samples_per_s
        forward_s, backward_s = step / 3, 2 * step / 3
        grads = gradients(layers, backward_s)
    step = forward_s + backward_s
    rows = []
    for p in rank_counts(largest, cluster.ranks_per_node):
        for algo in algos:
            for policy in policies:
                for mb in (bucket_mbs if policy == "hpctrain" else (None,)):
                    row = plan_point(grads, forward_s, backward_s, p, cluster, algo, policy,
                                     mb or 25.0, fusion_mb, cycle_ms)
                    row["samples_per_s"] = p * batch / row["step_s"]
                    row["efficiency"] = step / row["step_s"]
                    rows.append(row)
    return rows


def best(rows):
    """The fastest choice at each rank count."""
    chosen = {}
    for row in rows:
        if row["np"] not in chosen or row["samples_per_s"] > chosen[row["np"]]["samples_per_s"]:
            chosen[row["np"]] = row
    return [chosen[p] for p in sorted(chosen)]


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
#: One P100's images/s at batch 64 (TensorFlow's benchmarks, DGX-1, synthetic data, 2017).
P100_IMAGES_PER_S = {"inception_v3": 142.0, "resnet50": 219.0, "resnet152": 91.8,
                     "vgg16": 154.0}
#: The cluster of that benchmark, one description for every model (docs/studies.md says why).
HOROVOD_CLUSTER = {"ranks_per_node": 4, "intra": "pcie", "inter": "25gbe", "efficiency": 0.8}


def resnet101_images_per_s():
    """ResNet-101 is not in TensorFlow's table: a P100's time per image interpolated between
    ResNet-50's and ResNet-152's, linearly in the multiply-adds counted here."""
    macs = {name: sum(layer.macs for layer in model_layers(name)[0])
            for name in ("resnet50", "resnet101")}
    macs152 = sum(layer.macs for layer in architectures.layers(
        _resnet152(), (3, 224, 224)))
    t50, t152 = 1 / P100_IMAGES_PER_S["resnet50"], 1 / P100_IMAGES_PER_S["resnet152"]
    share = (macs["resnet101"] - macs["resnet50"]) / (macs152 - macs["resnet50"])
    return 1 / (t50 + share * (t152 - t50))


def _resnet152():
    import torch

    with torch.device("meta"):
        return architectures.resnet([3, 8, 36, 3])


def horovod_benchmark(fusion_mb=64.0, cycle_ms=1.0):
    """Published against predicted efficiency (%), Horovod's ring and fusion, per model and
    GPU count; every input is a module constant above."""
    cluster = link_cluster(HOROVOD_CLUSTER["ranks_per_node"], HOROVOD_CLUSTER["intra"],
                           HOROVOD_CLUSTER["inter"], HOROVOD_CLUSTER["efficiency"])
    rates = dict(P100_IMAGES_PER_S, resnet101=resnet101_images_per_s())
    out = []
    for name, published in HOROVOD_PUBLISHED.items():
        layers, _ = model_layers(name)
        rows = plan(layers, 64, rates[name], cluster, 512, ["ring"], ["horovod"],
                    fusion_mb=fusion_mb, cycle_ms=cycle_ms)
        at = {r["np"]: r for r in rows}
        for gpus, figure in zip((128, 512), published):
            predicted = 100 * at[gpus]["efficiency"]
            out.append({"model": name, "gpus": gpus, "images_per_s_1gpu": rates[name],
                        "published": figure, "predicted": predicted,
                        "difference": predicted - figure,
                        "exposed_s": at[gpus]["exposed_s"], "step_s": at[gpus]["step_s"]})
    return out, cluster


# ----- the command -------------------------------------------------------------------------------

def run(args):
    """``study plan``: the tables on stdout, and summary.md, plan.json and plots in --out."""
    if args.horovod_benchmark:
        return _run_horovod_benchmark(args)
    if not args.model:
        raise UsageError("give --model (e.g. resnet50), --horovod-benchmark or --against "
                         "TRAIN_DIR")
    if args.ranks_per_node is None:
        args.ranks_per_node = 8
    measuring = args.measure_compute
    if measuring and args.samples_per_s is not None:
        raise UsageError("give either --samples-per-s (one device's rate) or --measure-compute "
                         "(time the model here), not both")
    if not measuring and (args.samples_per_s is None or args.samples_per_s <= 0):
        raise UsageError("give --samples-per-s (one device's training samples/s at --batch) "
                         "or --measure-compute")
    shape = _shape(args.input) if args.input else None
    layers, shape = model_layers(args.model, shape)
    cluster = cluster_of(args)
    algos = _names(args.algos, cost.modelled(), "--algos")
    policies = _names(args.policies, POLICIES, "--policies")
    measured = None
    if measuring:
        from . import compute

        build, _ = model_builder(args.model, shape)
        measured = compute.measure(build(), shape, args.batch, args.measure_steps)
        args.samples_per_s = args.batch / (measured.forward_s + measured.backward_s)
    rows = plan(layers, args.batch, args.samples_per_s, cluster, args.ranks, algos, policies,
                [float(x) for x in args.bucket_mb.split(",")], args.fusion_mb, args.cycle_ms,
                measured)
    os.makedirs(args.out, exist_ok=True)
    text = summary(rows, args, cluster, layers, measured)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "plan.json"), "w") as f:
        json.dump({"model": args.model, "input": shape, "batch": args.batch,
                   "samples_per_s": args.samples_per_s, "cluster": cluster.description,
                   "params": cluster.params.as_dict(),
                   "compute": asdict(measured) if measured else None,
                   "layers": [asdict(layer) for layer in layers], "rows": rows}, f, indent=1)
    write_hdf5(os.path.join(args.out, "plan.h5"), rows, layers, {
        "model": args.model, "batch": args.batch, "samples_per_s": args.samples_per_s,
        "cluster": cluster.description, "params": cluster.params.as_dict(),
        "compute": asdict(measured) if measured else None})
    _plots(rows, args.out)
    print(text)
    return 0


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


def _run_horovod_benchmark(args):
    rows, cluster = horovod_benchmark(args.fusion_mb, args.cycle_ms)
    lines = ["# Horovod's published scaling against the plan", "",
             f"Cluster: {cluster.description}; Horovod's ring, fusion {args.fusion_mb:g} MB, "
             f"cycle {args.cycle_ms:g} ms; 64 images per GPU.", "",
             "| model | GPUs | one GPU images/s | published % | predicted % | difference | "
             "exposed ms | step ms |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['gpus']} | {r['images_per_s_1gpu']:.1f} | {r['published']} "
              f"| {r['predicted']:.1f} | {r['difference']:+.1f} | {1000 * r['exposed_s']:.1f} | "
              f"{1000 * r['step_s']:.1f} |" for r in rows]
    text = "\n".join(lines) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "horovod.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "horovod.json"), "w") as f:
        json.dump({"cluster": cluster.description, "rows": rows}, f, indent=1)
    print(text)
    return 0


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
    """The ``Cluster`` of the options: ``--params`` fitted by a study, else link presets."""
    if args.params:
        try:
            params = cost.params_of(read_profile(args.params))
        except (KeyError, TypeError, AttributeError) as exc:
            raise UsageError(f"--params {args.params}: not a study's params.json ({exc!r})") \
                from None
        return Cluster(args.ranks_per_node, params,
                       f"{args.ranks_per_node} ranks per node, parameters from {args.params}")
    return link_cluster(args.ranks_per_node, args.intra, args.inter, args.link_efficiency,
                        args.adapters, args.reduce_rate * 1e9)


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


def summary(rows, args, cluster, layers, measured=None):
    """The plan's markdown: inputs, the best choice per rank count, then every point."""
    nbytes = sum(layer.nbytes for layer in layers)
    if measured:
        compute = (f"- batch {args.batch} per rank; compute measured here (median of "
                   f"{measured.steps} steps): forward {1000 * measured.forward_s:.1f} ms, "
                   f"backward {1000 * measured.backward_s:.1f} ms ({args.samples_per_s:.1f} "
                   f"samples/s), each gradient ready when this backward had it")
    else:
        compute = (f"- batch {args.batch} per rank; one device {args.samples_per_s:g} samples/s, "
                   f"so a step computes {1000 * args.batch / args.samples_per_s:.1f} ms (1/3 "
                   f"forward, 2/3 backward)")
    lines = ["# Training plan", "",
             f"- model {args.model}: {len(layers)} layers with parameters, "
             f"{nbytes / 1e6:.1f} MB of float32 gradients, "
             f"{sum(layer.macs for layer in layers) / 1e9:.2f} G multiply-adds per sample",
             compute,
             f"- cluster: {cluster.description}", "",
             "## Best choice at each scale", "",
             "| p | nodes | choice | samples/s | efficiency | step ms | exposed ms | why |",
             "|---:|---:|---|---:|---:|---:|---:|---|"]
    for row in best(rows):
        why = ("nothing to reduce" if row["np"] == 1 else
               f"hides all but {1000 * row['exposed_s']:.1f} ms of {1000 * row['comm_s']:.1f} "
               f"ms of reductions in {row['transfers']} transfer(s)")
        lines.append(f"| {row['np']} | {row['nodes']} | {label(row)} | "
                     f"{row['samples_per_s']:.0f} | {row['efficiency']:.2f} | "
                     f"{1000 * row['step_s']:.1f} | {1000 * row['exposed_s']:.1f} | {why} |")
    lines += ["", "## Every point", "",
              "| p | choice | samples/s | efficiency | step ms | exposed ms | comm ms |",
              "|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['np']} | {label(r)} | {r['samples_per_s']:.0f} | {r['efficiency']:.2f} | "
              f"{1000 * r['step_s']:.1f} | {1000 * r['exposed_s']:.1f} | "
              f"{1000 * r['comm_s']:.1f} |" for r in rows]
    return "\n".join(lines) + "\n"


def _plots(rows, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    choices = sorted({label(r) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for choice in choices:
        mine = [r for r in rows if label(r) == choice]
        for ax, key in zip(axes, ("efficiency", "samples_per_s")):
            ax.plot([r["np"] for r in mine], [r[key] for r in mine], marker="o", ms=3,
                    label=choice)
    for ax, key in zip(axes, ("scaling efficiency", "samples/s (all ranks)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks p")
        ax.set_ylabel(key)
        ax.grid(True, alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "plan.png"), dpi=110)
    plt.close(fig)
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
    fig.tight_layout()
    fig.savefig(os.path.join(out, "timeline.png"), dpi=110)
    plt.close(fig)
