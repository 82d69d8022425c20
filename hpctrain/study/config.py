"""``hpctrain study``'s configurations: one typed dataclass per command, each field an
option (:func:`hpctrain.options.option`: default, range, help); ``study/cli.py`` generates
the command lines from them. A new option is one field in its command's block."""

import os
from dataclasses import dataclass

from ..options import check, option

#: ``study calibrate``'s sets of published runs (:mod:`.calibration` reads them from here:
#: this module stays light, for every command line's parse).
CALIBRATION_SETS = ("tuning", "held-out", "held-out-2", "held-out-3", "held-out-4",
                    "held-out-5")


@dataclass
class Launching:
    """What every study that launches MPI jobs takes: how to launch, how long, where to
    write."""

    launcher: str = option("local", "local (mpirun here), srun (in a Slurm allocation), or a "
                                    "command prefix taking -np N, e.g. 'scripts/vcluster "
                                    "mpirun'")
    launch_timeout: int = option(900, "seconds before a launch counts as hung (default: "
                                      "{default})", minimum=1)
    out: str = option("runs", "report folder (default: {default})")

    def __post_init__(self):
        check(self)


# --- study allreduce ----------------------------------------------------------------------
@dataclass
class AllreduceStudy(Launching):
    """``study allreduce``: ranks x algorithms x sizes, the model's fit, plots, a report."""

    #: ``--quick``: what it changes where the command line gives no value.
    PRESETS = {"quick": {"np": "2,3", "sizes": "8:1M", "factor": 16, "iters": 5, "warmup": 1}}

    out: str = option(os.path.join("runs", "study-allreduce"), "report folder (default: "
                                                                "{default})")
    np: str = option("2,3,4", "rank counts, e.g. 2,3,4 (default: {default})")
    algos: str = option("", "algorithms (default: all available)")
    sizes: str = option("8:64M", "MIN:MAX bytes, e.g. 8:64M (default: {default})")
    factor: int = option(4, "size step factor (default: {default})", minimum=2)
    iters: int = option(10, "timed iterations (default: {default})", minimum=1)
    warmup: int = option(2, "warm-up iterations (default: {default})", minimum=0)
    quick: bool = option(False, "np 2,3, sizes 8:1M x16, 5 iterations: under 2 minutes",
                         flag=True)
    ranks_per_node: int = option(0, "ranks are placed K to a node, by slot (an emulated or "
                                    "real cluster): fits α', β' between nodes (default: "
                                    "{default}, one node)", minimum=0, metavar="K")
    profile: str = option(None, "also time --allreduce auto with this profile (an earlier "
                                "study's params.json) and compare it with the best fixed "
                                "algorithm at every point; every rank count is then run "
                                "twice, to measure the noise", metavar="PARAMS_JSON")


# --- study train --------------------------------------------------------------------------
@dataclass
class TrainStudy(Launching):
    """``study train``: training samples/s under weak or strong scaling, per algorithm."""

    #: ``--quick``: what it changes where the command line gives no value.
    PRESETS = {"quick": {"np": "1,2", "allreduce": "ring,horovod,ddp", "epochs": 2,
                         "rounds": 1}}

    out: str = option(os.path.join("runs", "study-train"), "report folder (default: "
                                                            "{default})")
    np: str = option("1,2,4", "rank counts; 1 is always added (default: {default})")
    allreduce: str = option("horovod,mpi,ring,tree,butterfly,ddp",
                            "hpctrain train's --allreduce names, and ddp for the PyTorch "
                            "baseline (default: {default}; horovod where installed)")
    model: str = option("mlp", "model to train (default: {default})")
    batch_size: int = option(32, "batch size PER RANK, the same at every p: weak scaling "
                                 "(default: {default})", minimum=1)
    strong: bool = option(False, "strong scaling: split --global-batch over the ranks, the "
                                 "same global batch and steps at every p", flag=True)
    global_batch: int = option(None, "with --strong: the global batch, B / p per rank (B "
                                     "divisible by every --np)", metavar="B", minimum=1)
    epochs: int = option(3, "epochs per run, the first one warm-up (default: {default})",
                         minimum=2)
    max_steps: int = option(0, "stop each run after this many steps (default: {default}, no "
                               "limit)", minimum=0)
    set: list = option([], "any other `hpctrain train` key, for every run (repeatable), e.g. "
                           "--set data=data/synthetic.h5 --set model_mb=16",
                       metavar="KEY=VALUE", example="model_mb=16")
    rounds: int = option(1, "repeat every point, algorithm order rotated; the best round is "
                            "reported, the median beside it (default: {default})", minimum=1)
    quick: bool = option(False, "np 1,2, ring,horovod,ddp, 2 epochs of the digits MLP: about "
                                "a minute", flag=True)
    tensorboard: str = option("", "every run's TensorBoard event files, in DIR/ALGO-pP-rR "
                                  "(needs the extra: pip install 'hpctrain[tensorboard]'; "
                                  "default: none)", metavar="DIR")


# --- study plan ---------------------------------------------------------------------------
RANGE = "VALUE[:LOW:HIGH]"


@dataclass
class PlanStudy:
    """``study plan``: a training step predicted at scale, or against measured runs."""

    #: The help's groups: title -> the fields in it.
    GROUPS = {
        "the model and one device's compute": ("model", "input", "batch", "samples_per_s",
                                               "measure_compute", "measure_steps"),
        "the cluster: ranks and links": ("ranks", "ranks_per_node", "intra", "inter",
                                         "adapters", "link_efficiency", "reduce_rate"),
        "the terms besides compute and communication, and the band": (
            "spread", "slowdown", "update_ms", "negotiation_us", "negotiation_rank_us",
            "framework_us", "measured_efficiency", "defaults", "band", "global_batch"),
        "how gradients are reduced": ("params", "algos", "policies", "bucket_mb", "fusion_mb",
                                      "cycle_ms"),
    }

    # the model and one device's compute
    model: str = option(None, "resnet50, resnet101, vgg16, inception_v3, hpctrain's mlp, cnn, "
                              "wide (with --input), or package.module:factory (with --input)")
    input: str = option(None, "one sample's shape, for a factory", metavar="C,H,W")
    batch: int = option(64, "batch per rank (default: {default})")
    samples_per_s: str = option(None, "one device's training samples/s at --batch (a range "
                                      "widens the band: a faster device hides less)",
                                metavar=RANGE)
    measure_compute: bool = option(False, "instead of --samples-per-s: time forward and "
                                          "backward of the model at --batch here, each "
                                          "layer's gradient as backward hands it over, the "
                                          "steps' spread, and backward's slowdown with a "
                                          "reduction beside it", flag=True)
    measure_steps: int = option(3, "timed steps for --measure-compute, after one warm-up "
                                   "(default: {default})")
    # the cluster: ranks and links
    ranks: int = option(512, "the largest rank count (default: {default}, at most 4096)")
    ranks_per_node: int = option(None, "ranks (GPUs) per node (default: 8; with --against, "
                                       "the fit's --ranks-per-node)")
    intra: str = option("nvlink-v100", "link inside a node: a preset (nvlink-p100, "
                                       "nvlink-v100, nvlink-a100, nvlink-h100, pcie3, pcie4, "
                                       "pcie5) or RATE[,LATENCY], e.g. 200GB/s,2us (default: "
                                       "{default})")
    inter: str = option("ib-edr", "link between nodes: a preset (10gbe, 25gbe, 40gbe, 50gbe, "
                                  "100gbe, 200gbe, 400gbe, ib-edr, ib-hdr, ib-ndr) or "
                                  "RATE[,LATENCY], e.g. 50gbit,5us (default: {default})")
    adapters: int = option(1, "network adapters per node (default: {default})")
    link_efficiency: float = option(1.0, "share of the links' practical busbw reached "
                                         "(default: {default})")
    reduce_rate: float = option(100.0, "GB/s one rank sums gradients at (default: 100)")
    # the terms besides compute and communication, and the band
    spread: str = option(None, "stragglers: one rank's step time, standard deviation over "
                               "mean (e.g. 0.02:0.01:0.04; default: measured by "
                               "--measure-compute, else none)", metavar=RANGE)
    slowdown: str = option(None, "backward's slowdown factor while a reduction runs beside "
                                 "it, >= 1 (e.g. 1.05:1:1.1; default: measured by "
                                 "--measure-compute, else 1)", metavar=RANGE)
    update_ms: str = option(None, "tail: the update of all parameters, charged for the "
                                  "gradients reduced after backward, where one rank updates "
                                  "during backward (default: 0)", metavar=RANGE)
    negotiation_us: str = option(None, "µs to agree on one tensor per cycle (default: 0; "
                                       "Horovod measured here: 10:7:33)", metavar=RANGE)
    negotiation_rank_us: str = option(None, "µs more per tensor and per rank, for a "
                                            "coordinator that gathers every rank's requests "
                                            "(default: 0)", metavar=RANGE)
    framework_us: str = option(None, "µs the framework's own work costs per gradient and step "
                                     "at p > 1 (hooks, copies into buckets), for every policy "
                                     "(default: per policy, data/defaults.toml: DDP 19-48)",
                               metavar=RANGE)
    measured_efficiency: str = option(None, "an efficiency measured at P ranks (a smaller run "
                                            "of the same model, cluster, first --algos and "
                                            "--policies): what the terms do not explain there "
                                            "is carried to every p as a residual (e.g. "
                                            "16=0.94:0.93:0.95)", metavar="P=" + RANGE)
    defaults: str = option(None, "the default range and source of every term not given "
                                 "(default: hpctrain/study/data/defaults.toml)", metavar="TOML")
    band: bool = option(False, "each efficiency with a low and a high from the inputs' ranges "
                               "(presets' busbw, VALUE:LOW:HIGH figures, measured spreads)",
                        flag=True)
    global_batch: int = option(None, "strong scaling too: B split from --batch per rank down "
                                     "to 1 (e.g. 1024 with --batch 64: 16 x 64 ... 1024 x 1)",
                               metavar="B")
    # how gradients are reduced
    params: str = option(None, "a params.json from study allreduce, instead of links")
    algos: str = option("ring,hierarchical", "allreduce algorithms of the cost model "
                                             "(default: {default})")
    policies: str = option("hpctrain,ddp,horovod", "gradient policies (default: {default})")
    bucket_mb: str = option("4,25", "hpctrain's bucket sizes to compare (default: {default})")
    fusion_mb: float = option(64.0, "Horovod's fusion buffer (default: 64, its size in 2017)")
    cycle_ms: float = option(None, "Horovod's cycle time (default: 1, today's; with "
                                   "--horovod-benchmark 5, the 2017 loop's sleep)")
    # what the plan is held against, and where it goes
    against: list = option([], "predict every point a `study train` measured (its --out "
                               "folder; repeatable or comma-separated) from its p = 1 point, "
                               "its model and --params, and give the error (docs/studies.md)",
                           metavar="TRAIN_DIR", example="runs/train-weak")
    horovod_benchmark: bool = option(False, "Horovod's published runs against the plan "
                                            "(docs/studies.md)", flag=True)
    out: str = option(os.path.join("runs", "plan"), "folder for summary.md, plan.json, "
                                                    "plan.png, timeline.png (with --against: "
                                                    "against.md, against.json)")

    def __post_init__(self):
        check(self)


# --- study calibrate ----------------------------------------------------------------------
@dataclass
class CalibrateStudy:
    """``study calibrate``: the plan against published whole runs."""

    published: str = option(None, "published runs (default: "
                                  "hpctrain/study/data/published.toml)", metavar="TOML")
    defaults: str = option(None, "default ranges (default: hpctrain/study/data/defaults.toml)",
                           metavar="TOML")
    set: str = option("all", "which runs (default: {default})", choices=(*CALIBRATION_SETS, "all"))
    tune: bool = option(False, "instead: choose the residuals' default ranges, the narrowest "
                               "that put the most runs inside their band: share on the tuning "
                               "set, share_node (one NVLink node) on the tuning and held-out "
                               "sets; held-out-2 to -5 never (with --set all: the sets "
                               "tuned on)",
                        flag=True)
    out: str = option(os.path.join("runs", "calibrate"), "folder for calibration.md and "
                                                         "calibration.json")

    def __post_init__(self):
        check(self)


# --- study fattree ------------------------------------------------------------------------
@dataclass
class FattreeStudy:
    """``study fattree``: the allreduce's closed form against a SimGrid fat tree."""

    ranks: str = option("16,64,256", "rank counts, one rank per host (default: {default})")
    sizes: str = option("1M,100M", "allreduce sizes, e.g. 1M,100M (default: {default})")
    oversubscription: str = option("1,4", "leaf uplink oversubscription factors, 1 "
                                          "non-blocking (default: {default})")
    placements: str = option("order,scatter,random", "rank placements: order, scatter "
                                                     "(round-robin over the leaves), random "
                                                     "(default: all three)")
    algos: str = option("ring", "ring, butterfly (default: {default})")
    hosts_per_leaf: int = option(8, "hosts under each leaf switch (default: {default})")
    link: str = option("ib-edr", "host link preset of study plan: 10gbe, 25gbe, 100gbe, "
                                 "ib-edr, ib-hdr, ... (default: {default})")
    reduce_rate: float = option(100.0, "GB/s one host sums at (default: 100)")
    seed: int = option(0, "seed of the random placement (default: {default})")
    timeout: int = option(600, "seconds one simulation may take (default: {default})")
    out: str = option(os.path.join("runs", "fattree"), "folder for summary.md and "
                                                       "fattree.json")

    def __post_init__(self):
        check(self)


# --- study predict ------------------------------------------------------------------------
@dataclass
class PredictStudy:
    """``study predict``: time and busbw per algorithm at scale, from a fit or a link."""

    params: str = option(None, "params.json written by study allreduce")
    ranks_per_node: int = option(0, "ranks per node at scale (default: the study's, else 8)",
                                 metavar="K")
    node_link: str = option(None, "link rate inside a node, e.g. 200GB/s: a two-level model "
                                  "(--link is between nodes)")
    node_alpha: str = option("0.5us", "message latency inside a node (default: {default})")
    link: str = option(None, "link rate, e.g. 100gbit (InfiniBand EDR) or 42GB/s")
    alpha: str = option("2us", "message latency (default: {default})")
    gamma_rate: str = option("20GB/s", "reduction throughput per rank (default: {default})")
    out: str = option(os.path.join("runs", "predict"), "folder for prediction.png and "
                                                       "prediction.md")

    def __post_init__(self):
        check(self)
