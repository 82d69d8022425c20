"""``hpctrain study``: allreduce and training scaling studies, and predictions at scale."""

import argparse
import os

from .. import faults
from ..options import add_arguments
from .config import (AllreduceStudy, CalibrateStudy, FattreeStudy, PlanStudy, PredictStudy,
                     TrainStudy)

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
    add_arguments(allreduce, AllreduceStudy)
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
    add_arguments(train, TrainStudy)
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
    add_arguments(planner, PlanStudy)
    planner.set_defaults(func=_run_plan)


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
    add_arguments(calibrate, CalibrateStudy)
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
    add_arguments(fattree, FattreeStudy)
    fattree.set_defaults(func=_run_fattree)


def _add_predict(kinds):
    """``study predict``'s options."""
    predict = kinds.add_parser(
        "predict", help="predicted time and busbw per algorithm for p <= 4096, n <= 1 GiB",
        description="From a study's fitted parameters (--params) or from a link's figures "
                    "(--link, --alpha, --gamma-rate).")
    add_arguments(predict, PredictStudy)
    predict.set_defaults(func=_run_predict)

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

    args.batch_size_given = "batch_size" in args.given
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
