"""``hpctrain study``: allreduce and training scaling studies, and predictions at scale."""

import argparse
import os

from .. import faults

TRAIN_DESCRIPTION = """\
Training throughput under WEAK scaling: the batch per rank stays fixed while the ranks grow
(global batch = batch x p); with --strong --global-batch B, under STRONG scaling: the global
batch stays B and each rank takes B / p, so every p runs the same steps. For every --np and
every --allreduce name, one MPI job trains the same model on the same batches: `hpctrain
train --allreduce NAME`, or for the name `ddp` PyTorch DistributedDataParallel over gloo,
the baseline you would otherwise pick. The first epoch of each run is warm-up; the others
give samples/s (all ranks' samples over the slowest rank's training time). Scaling
efficiency = samples/s at p / (p x samples/s at 1).

Writes to --out: train.json (every point and epoch), samples_per_s_vs_p.png,
efficiency_vs_p.png, summary.md (a table; points with more ranks than cores are marked *),
and runs/ (each run's metrics.csv and log). Run it as one process, not under mpirun.
"""


def add_parser(subparsers):
    """Register ``study allreduce``, ``train``, ``plan``, ``calibrate``, ``fattree`` and
    ``predict``."""
    parser = subparsers.add_parser(
        "study", help="scaling studies: sweep, fit the α-β-γ model, plot, predict at scale",
        description="Run as ONE process (not under mpirun): the study launches the benchmarks "
                    "itself, once per rank count.")
    kinds = parser.add_subparsers(dest="study", required=True, metavar="STUDY")
    _add_allreduce(kinds)
    _add_train(kinds)
    _add_plan(kinds)
    _add_calibrate(kinds)
    _add_fattree(kinds)
    _add_predict(kinds)
    return parser


def _add_allreduce(kinds):
    """``study allreduce``'s options."""
    allreduce = kinds.add_parser(
        "allreduce", help="ranks x algorithms x sizes, model fit, plots and a report",
        description="Runs bench p2p at 2 ranks and bench allreduce at each --np, fits α, β, γ, "
                    "and writes study.h5, params.json, PNG plots and summary.md to --out.")
    allreduce.add_argument("--np", help="rank counts, e.g. 2,3,4 (default: 2,3,4)")
    allreduce.add_argument("--algos", default="", help="algorithms (default: all available)")
    allreduce.add_argument("--sizes", help="MIN:MAX bytes, e.g. 8:64M (default: 8:64M)")
    allreduce.add_argument("--factor", type=int, help="size step factor (default: 4)")
    allreduce.add_argument("--iters", type=int, help="timed iterations (default: 10)")
    allreduce.add_argument("--warmup", type=int, help="warm-up iterations (default: 2)")
    allreduce.add_argument("--quick", action="store_true",
                           help="np 2,3, sizes 8:1M x16, 5 iterations: under 2 minutes")
    allreduce.add_argument("--ranks-per-node", type=int, default=0, metavar="K",
                           help="ranks are placed K to a node, by slot (an emulated or real "
                                "cluster): fits α', β' between nodes (default: 0, one node)")
    allreduce.add_argument("--profile", metavar="PARAMS_JSON",
                           help="also time --allreduce auto with this profile (an earlier "
                                "study's params.json) and compare it with the best fixed "
                                "algorithm at every point; every rank count is then run "
                                "twice, to measure the noise")
    _add_launch_options(allreduce, os.path.join("runs", "study-allreduce"))
    allreduce.set_defaults(func=_run_allreduce)


def _add_train(kinds):
    """``study train``'s options."""
    train = kinds.add_parser(
        "train", help="training samples/s and weak- or strong-scaling efficiency per "
                     "algorithm, vs DDP",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=TRAIN_DESCRIPTION,
        epilog="examples:\n"
               "  python -m hpctrain study train --quick         # np 1,2; ring, horovod, ddp\n"
               "  python -m hpctrain study train --np 1,2,4 --allreduce ring,mpi,horovod,ddp\n"
               "  python -m hpctrain study train --model wide --set model_mb=4 --epochs 2\n"
               "  python -m hpctrain study train --strong --global-batch 96 --np 1,2,3,4")
    train.add_argument("--np", help="rank counts; 1 is always added (default: 1,2,4)")
    train.add_argument("--allreduce", help="hpctrain train's --allreduce names, and ddp for "
                                           "the PyTorch baseline (default: horovod,mpi,ring,"
                                           "tree,butterfly,ddp; horovod where installed)")
    train.add_argument("--model", default="mlp", help="model to train (default: mlp)")
    train.add_argument("--batch-size", type=int, default=None,
                       help="batch size PER RANK, the same at every p: weak scaling "
                            "(default: 32)")
    train.add_argument("--strong", action="store_true",
                       help="strong scaling: split --global-batch over the ranks, the same "
                            "global batch and steps at every p")
    train.add_argument("--global-batch", type=int, metavar="B",
                       help="with --strong: the global batch, B / p per rank (B divisible "
                            "by every --np)")
    train.add_argument("--epochs", type=int,
                       help="epochs per run, the first one warm-up (default: 3)")
    train.add_argument("--max-steps", type=int, default=0,
                       help="stop each run after this many steps (default: 0, no limit)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="any other `hpctrain train` key, for every run (repeatable), "
                            "e.g. --set data=data/synthetic.h5 --set model_mb=16")
    train.add_argument("--rounds", type=int,
                       help="repeat every point, algorithm order rotated; the best round is "
                            "reported, the median beside it (default: 1)")
    train.add_argument("--quick", action="store_true",
                       help="np 1,2, ring,horovod,ddp, 2 epochs of the digits MLP: about a "
                            "minute")
    train.add_argument("--tensorboard", metavar="DIR", default="",
                       help="every run's TensorBoard event files, in DIR/ALGO-pP-rR (needs "
                            "the extra: pip install 'hpctrain[tensorboard]'; default: none)")
    _add_launch_options(train, os.path.join("runs", "study-train"))
    train.set_defaults(func=_run_train)


def _add_plan(kinds):
    """``study plan``'s options."""
    planner = kinds.add_parser(
        "plan", help="predict a training step at scale: compute, exposed communication, "
                     "samples/s and efficiency per algorithm and gradient policy",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Predict a data-parallel training step at every rank count up to "
                    "--ranks, from a model's layers (built on the meta device: shapes only), "
                    "one device's samples/s and a cluster's links; or, with --against, "
                    "every point of a measured `study train`. See docs/studies.md.",
        epilog="examples:\n"
               "  python -m hpctrain study plan --model resnet50 --samples-per-s 400 \\\n"
               "      --batch 64 --ranks 512 --intra nvlink-v100 --inter ib-edr\n"
               "  python -m hpctrain study plan --model vgg16 --samples-per-s 154 --ranks 512 \\\n"
               "      --ranks-per-node 4 --intra pcie3 --inter 25gbe --spread 0.02:0:0.04 --band\n"
               "  python -m hpctrain study plan --horovod-benchmark    # against published runs\n"
               "  python -m hpctrain study plan --against runs/train-weak,runs/train-strong \\\n"
               "      --params runs/study-vcluster/params.json        # against measured training")
    _plan_model_options(planner.add_argument_group("the model and one device's compute"))
    _plan_cluster_options(planner.add_argument_group("the cluster: ranks and links"))
    _plan_terms_options(planner.add_argument_group(
        "the terms besides compute and communication, and the band"))
    _plan_reduction_options(planner.add_argument_group("how gradients are reduced"))
    planner.add_argument("--against", action="append", default=[], metavar="TRAIN_DIR",
                         help="predict every point a `study train` measured (its --out "
                              "folder; repeatable or comma-separated) from its p = 1 point, "
                              "its model and --params, and give the error (docs/studies.md)")
    planner.add_argument("--horovod-benchmark", action="store_true",
                         help="Horovod's published runs against the plan (docs/studies.md)")
    planner.add_argument("--out", default=os.path.join("runs", "plan"),
                         help="folder for summary.md, plan.json, plan.png, timeline.png "
                              "(with --against: against.md, against.json)")
    planner.set_defaults(func=_run_plan)


def _plan_model_options(group):
    """``study plan``'s options: the model and one device's compute."""
    group.add_argument("--model", help="resnet50, resnet101, vgg16, inception_v3, "
                                       "hpctrain's mlp, cnn, wide (with --input), or "
                                       "package.module:factory (with --input)")
    group.add_argument("--input", metavar="C,H,W", help="one sample's shape, for a factory")
    group.add_argument("--batch", type=int, default=64, help="batch per rank (default: 64)")
    group.add_argument("--samples-per-s", metavar="VALUE[:LOW:HIGH]",
                       help="one device's training samples/s at --batch (a range widens "
                            "the band: a faster device hides less)")
    group.add_argument("--measure-compute", action="store_true",
                       help="instead of --samples-per-s: time forward and backward of the "
                            "model at --batch here, each layer's gradient as backward hands "
                            "it over, the steps' spread, and backward's slowdown with a "
                            "reduction beside it")
    group.add_argument("--measure-steps", type=int, default=3,
                       help="timed steps for --measure-compute, after one warm-up "
                            "(default: 3)")


def _plan_cluster_options(group):
    """``study plan``'s options: the cluster: ranks and links."""
    group.add_argument("--ranks", type=int, default=512,
                       help="the largest rank count (default: 512, at most 4096)")
    group.add_argument("--ranks-per-node", type=int, default=None,
                       help="ranks (GPUs) per node (default: 8; with --against, the "
                            "fit's --ranks-per-node)")
    group.add_argument("--intra", default="nvlink-v100",
                       help="link inside a node: a preset (nvlink-p100, nvlink-v100, "
                            "nvlink-a100, nvlink-h100, pcie3, pcie4, pcie5) or RATE[,LATENCY], "
                            "e.g. 200GB/s,2us (default: nvlink-v100)")
    group.add_argument("--inter", default="ib-edr",
                       help="link between nodes: a preset (10gbe, 25gbe, 40gbe, 50gbe, 100gbe, "
                            "200gbe, 400gbe, ib-edr, ib-hdr, ib-ndr) or RATE[,LATENCY], e.g. "
                            "50gbit,5us (default: ib-edr)")
    group.add_argument("--adapters", type=int, default=1,
                       help="network adapters per node (default: 1)")
    group.add_argument("--link-efficiency", type=float, default=1.0,
                       help="share of the links' practical busbw reached (default: 1.0)")
    group.add_argument("--reduce-rate", type=float, default=100.0,
                       help="GB/s one rank sums gradients at (default: 100)")


def _plan_terms_options(group):
    """``study plan``'s options: the terms besides compute and communication, and the band."""
    group.add_argument("--spread", metavar="VALUE[:LOW:HIGH]",
                       help="stragglers: one rank's step time, standard deviation over mean "
                            "(e.g. 0.02:0.01:0.04; default: measured by --measure-compute, "
                            "else none)")
    group.add_argument("--slowdown", metavar="VALUE[:LOW:HIGH]",
                       help="backward's slowdown factor while a reduction runs beside it, "
                            ">= 1 (e.g. 1.05:1:1.1; default: measured by --measure-compute, "
                            "else 1)")
    group.add_argument("--update-ms", metavar="VALUE[:LOW:HIGH]",
                       help="tail: the update of all parameters, charged for the gradients "
                            "reduced after backward, where one rank updates during backward "
                            "(default: 0)")
    group.add_argument("--negotiation-us", metavar="VALUE[:LOW:HIGH]",
                       help="µs to agree on one tensor per cycle (default: 0; Horovod "
                            "measured here: 10:7:33)")
    group.add_argument("--negotiation-rank-us", metavar="VALUE[:LOW:HIGH]",
                       help="µs more per tensor and per rank, for a coordinator that "
                            "gathers every rank's requests (default: 0)")
    group.add_argument("--measured-efficiency", metavar="P=VALUE[:LOW:HIGH]",
                       help="an efficiency measured at P ranks (a smaller run of the same "
                            "model, cluster, first --algos and --policies): what the terms "
                            "do not explain there is carried to every p as a residual "
                            "(e.g. 16=0.94:0.93:0.95)")
    group.add_argument("--defaults", metavar="TOML",
                       help="the default range and source of every term not given "
                            "(default: hpctrain/study/data/defaults.toml)")
    group.add_argument("--band", action="store_true",
                       help="each efficiency with a low and a high from the inputs' ranges "
                            "(presets' busbw, VALUE:LOW:HIGH figures, measured spreads)")
    group.add_argument("--global-batch", type=int, metavar="B",
                       help="strong scaling too: B split from --batch per rank down to 1 "
                            "(e.g. 1024 with --batch 64: 16 x 64 ... 1024 x 1)")


def _plan_reduction_options(group):
    """``study plan``'s options: how gradients are reduced."""
    group.add_argument("--params", help="a params.json from study allreduce, instead of links")
    group.add_argument("--algos", default="ring,hierarchical",
                       help="allreduce algorithms of the cost model (default: "
                            "ring,hierarchical)")
    group.add_argument("--policies", default="hpctrain,ddp,horovod",
                       help="gradient policies (default: hpctrain,ddp,horovod)")
    group.add_argument("--bucket-mb", default="4,25",
                       help="hpctrain's bucket sizes to compare (default: 4,25)")
    group.add_argument("--fusion-mb", type=float, default=64.0,
                       help="Horovod's fusion buffer (default: 64, its size in 2017)")
    group.add_argument("--cycle-ms", type=float, default=None,
                       help="Horovod's cycle time (default: 1, today's; with "
                            "--horovod-benchmark 5, the 2017 loop's sleep)")

def _add_calibrate(kinds):
    """``study calibrate``'s options."""
    calibrate = kinds.add_parser(
        "calibrate", help="the plan, given only a planning user's inputs, against published "
                          "whole runs: a tuning set and three held-out sets",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Plan every published run of --published from what a planning user knows "
                    "(model, one device's rate, batch, devices per node, links, gradient "
                    "policy), every other term at its default range (--defaults), and print "
                    "published, point and band per run, and per set the share of published "
                    "figures inside their band and the mean signed and absolute error. See "
                    "docs/studies.md.",
        epilog="examples:\n"
               "  python -m hpctrain study calibrate                 # every set\n"
               "  python -m hpctrain study calibrate --set held-out-2\n"
               "  python -m hpctrain study calibrate --tune          # the residuals' "
               "ranges")
    calibrate.add_argument("--published", metavar="TOML",
                           help="published runs (default: hpctrain/study/data/published.toml)")
    calibrate.add_argument("--defaults", metavar="TOML",
                           help="default ranges (default: hpctrain/study/data/defaults.toml)")
    calibrate.add_argument("--set", default="all",
                           choices=("tuning", "held-out", "held-out-2", "held-out-3", "all"),
                           help="which runs (default: all)")
    calibrate.add_argument("--tune", action="store_true",
                           help="instead: choose the residuals' default ranges, the narrowest "
                                "that put the most runs inside their band: share on the tuning "
                                "set, share_node (one NVLink node) on the tuning and held-out "
                                "sets; held-out-2 and -3 never (with --set all: the sets tuned on)")
    calibrate.add_argument("--out", default=os.path.join("runs", "calibrate"),
                           help="folder for calibration.md and calibration.json")
    calibrate.set_defaults(func=_run_calibrate)


def _add_fattree(kinds):
    """``study fattree``'s options."""
    fattree = kinds.add_parser(
        "fattree", help="the allreduce's closed form against a SimGrid simulation of a fat "
                        "tree with oversubscribed uplinks",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Simulate the ring (and butterfly) allreduce with SimGrid's flow model "
                    "over a two-level fat tree, ranks placed in order, scattered over the "
                    "leaves or at random, and compare with the cost model's closed form for "
                    "the same link. Needs SimGrid (apt-get install python3-simgrid). See "
                    "docs/studies.md.",
        epilog="examples:\n"
               "  python -m hpctrain study fattree --ranks 16,64,256 --sizes 1M,100M \\\n"
               "      --oversubscription 1,4 --out runs/fattree\n"
               "  python -m hpctrain study fattree --ranks 64 --algos ring,butterfly "
               "--placements order")
    fattree.add_argument("--ranks", default="16,64,256",
                         help="rank counts, one rank per host (default: 16,64,256)")
    fattree.add_argument("--sizes", default="1M,100M",
                         help="allreduce sizes, e.g. 1M,100M (default: 1M,100M)")
    fattree.add_argument("--oversubscription", default="1,4",
                         help="leaf uplink oversubscription factors, 1 non-blocking "
                              "(default: 1,4)")
    fattree.add_argument("--placements", default="order,scatter,random",
                         help="rank placements: order, scatter (round-robin over the leaves), "
                              "random (default: all three)")
    fattree.add_argument("--algos", default="ring", help="ring, butterfly (default: ring)")
    fattree.add_argument("--hosts-per-leaf", type=int, default=8,
                         help="hosts under each leaf switch (default: 8)")
    fattree.add_argument("--link", default="ib-edr",
                         help="host link preset of study plan: 10gbe, 25gbe, 100gbe, ib-edr, "
                              "ib-hdr, ... (default: ib-edr)")
    fattree.add_argument("--reduce-rate", type=float, default=100.0,
                         help="GB/s one host sums at (default: 100)")
    fattree.add_argument("--seed", type=int, default=0,
                         help="seed of the random placement (default: 0)")
    fattree.add_argument("--timeout", type=int, default=600,
                         help="seconds one simulation may take (default: 600)")
    fattree.add_argument("--out", default=os.path.join("runs", "fattree"),
                         help="folder for summary.md and fattree.json")
    fattree.set_defaults(func=_run_fattree)


def _add_predict(kinds):
    """``study predict``'s options."""
    predict = kinds.add_parser(
        "predict", help="predicted time and busbw per algorithm for p <= 4096, n <= 1 GiB",
        description="From a study's fitted parameters (--params) or from a link's figures "
                    "(--link, --alpha, --gamma-rate).")
    predict.add_argument("--params", help="params.json written by study allreduce")
    predict.add_argument("--ranks-per-node", type=int, default=0, metavar="K",
                         help="ranks per node at scale (default: the study's, else 8)")
    predict.add_argument("--node-link", help="link rate inside a node, e.g. 200GB/s: a "
                                             "two-level model (--link is between nodes)")
    predict.add_argument("--node-alpha", default="0.5us",
                         help="message latency inside a node (default: 0.5us)")
    predict.add_argument("--link", help="link rate, e.g. 100gbit (InfiniBand EDR) or 42GB/s")
    predict.add_argument("--alpha", default="2us", help="message latency (default: 2us)")
    predict.add_argument("--gamma-rate", default="20GB/s",
                         help="reduction throughput per rank (default: 20GB/s)")
    predict.add_argument("--out", default=os.path.join("runs", "predict"),
                         help="folder for prediction.png and prediction.md")
    predict.set_defaults(func=_run_predict)

def _add_launch_options(parser, out):
    # What every study that launches MPI jobs takes: how to launch, how long, where to write.
    parser.add_argument("--launcher", default="local",
                        help="local (mpirun here), srun (in a Slurm allocation), or a "
                             "command prefix taking -np N, e.g. 'scripts/vcluster mpirun'")
    parser.add_argument("--launch-timeout", type=int, default=900,
                        help="seconds before a launch counts as hung (default: 900)")
    parser.add_argument("--out", default=out, help=f"report folder (default: {out})")


def _run_allreduce(args):
    _single_process()
    faults.inject("study.start", 0)
    from . import allreduce

    return allreduce.run(args)


def _run_plan(args):
    # --against compares the plan with measured runs and --horovod-benchmark with published
    # ones; plan_against and calibration build on plan, so the choice is made here, above all.
    if args.against:
        from . import plan_against

        return plan_against.run(args)
    if args.horovod_benchmark:              # both ways: calibration builds on plan too
        from . import calibration

        return calibration.run_horovod(args)
    from . import plan

    return plan.run(args)


def _run_calibrate(args):
    from . import calibration

    return calibration.run(args)


def _run_fattree(args):
    from . import fattree

    return fattree.run(args)


def _run_train(args):
    _single_process()
    faults.inject("study.start", 0)
    from . import train

    args.batch_size_given = args.batch_size is not None
    if args.batch_size is None:
        args.batch_size = 32

    return train.run(args)


def _run_predict(args):
    faults.inject("study.start", 0)
    from . import predict

    return predict.run(args)


def _single_process():
    from ..errors import UsageError
    from ..runtime import launcher_rank

    if launcher_rank() != 0 or any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")) \
            and int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", 1))) > 1:
        raise UsageError("study launches its own MPI jobs: run it as one process, "
                         "not under mpirun or srun")
