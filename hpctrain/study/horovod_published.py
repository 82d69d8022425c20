"""Horovod's published benchmark (its docs and its README of August 2017): the figures, the
cluster they were measured on with each input's source, and the planner's prediction of
them term by term (:func:`horovod_benchmark`), which ``study plan --horovod-benchmark`` and
``study calibrate`` print (:func:`.plan_report.horovod_markdown`)."""

from dataclasses import asdict, replace

from . import links
from .overheads import Figure, Overheads, exact
from .planner import FLIP, TERM_KEYS, links_cluster, model_layers, plan, solved


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


def inside_band(row):
    """Whether a published figure, given in whole per cent (± 0.5), meets its band."""
    return row["low"] <= row["published"] + 0.5 and row["published"] - 0.5 <= row["high"]
