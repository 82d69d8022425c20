"""``hpctrain study``: allreduce scaling studies and predictions at scale."""

import os


def add_parser(subparsers):
    """Register ``study allreduce`` and ``study predict``."""
    parser = subparsers.add_parser(
        "study", help="scaling studies: sweep, fit the α-β-γ model, plot, predict at scale",
        description="Run as ONE process (not under mpirun): the study launches the benchmarks "
                    "itself, once per rank count.")
    kinds = parser.add_subparsers(dest="study", required=True, metavar="STUDY")

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
    allreduce.add_argument("--profile", metavar="PARAMS_JSON",
                           help="also time --allreduce auto with this profile (an earlier "
                                "study's params.json) and compare it with the best fixed "
                                "algorithm at every point")
    allreduce.add_argument("--launcher", default="local",
                           help="local (mpirun here), srun (in a Slurm allocation), or a "
                                "command prefix taking -np N, e.g. 'scripts/vcluster mpirun'")
    allreduce.add_argument("--launch-timeout", type=int, default=900,
                           help="seconds before a launch counts as hung (default: 900)")
    allreduce.add_argument("--out", default=os.path.join("runs", "study-allreduce"),
                           help="report folder (default: runs/study-allreduce)")
    allreduce.set_defaults(func=_run_allreduce)

    predict = kinds.add_parser(
        "predict", help="predicted time and busbw per algorithm for p <= 4096, n <= 1 GiB",
        description="From a study's fitted parameters (--params) or from a link's figures "
                    "(--link, --alpha, --gamma-rate).")
    predict.add_argument("--params", help="params.json written by study allreduce")
    predict.add_argument("--link", help="link rate, e.g. 100gbit (InfiniBand EDR) or 42GB/s")
    predict.add_argument("--alpha", default="2us", help="message latency (default: 2us)")
    predict.add_argument("--gamma-rate", default="20GB/s",
                         help="reduction throughput per rank (default: 20GB/s)")
    predict.add_argument("--out", default=os.path.join("runs", "predict"),
                         help="folder for prediction.png and prediction.md")
    predict.set_defaults(func=_run_predict)
    return parser


def _run_allreduce(args):
    _single_process()
    from . import allreduce

    return allreduce.run(args)


def _run_predict(args):
    from . import predict

    return predict.run(args)


def _single_process():
    from ..errors import UsageError
    from ..runtime import launcher_rank

    if launcher_rank() != 0 or any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")) \
            and int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", 1))) > 1:
        raise UsageError("study launches its own MPI jobs: run it as one process, "
                         "not under mpirun or srun")
