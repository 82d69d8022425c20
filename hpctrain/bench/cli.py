"""``hpctrain bench``: one benchmark per collective plug-in (``blocks.PLUGINS``: allreduce,
allgather, reducescatter, alltoall, broadcast, reduce), all run by one driver, and the
point-to-point and ``torch.distributed`` benchmarks."""

from .blocks import PLUGINS
from .sizes import parse_size


def add_parser(subparsers):
    """Register one command per collective of ``blocks.PLUGINS`` (its command line is the
    plug-in's ``command``), ``p2p`` and ``torch-distributed``."""
    parser = subparsers.add_parser(
        "bench", help="benchmarks: allreduce algorithms side by side, point-to-point α/β",
        description="Benchmarks modelled on nccl-tests. Run under mpirun, e.g. "
                    "mpirun -np 4 python -m hpctrain bench allreduce -b 8 -e 64M -f 4")
    kinds = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")

    for name, plugin in PLUGINS.items():
        command = plugin.command
        parser_ = kinds.add_parser(
            name, help=f"time every {name} algorithm per size ({command.moves}); check the "
                       f"results",
            description=f"Time each {name} algorithm at each size on the same "
                        f"{command.buffers}, side by side. Prints a #-header (settings, "
                        f"versions, rank map), one row per size and algorithm (time "
                        f"min/avg/max over ranks, algbw, busbw, #wrong) and a footer; "
                        f"{command.size}. Exits 1 if any value was wrong.")
        _common(parser_, default_min=command.smallest, default_max="64M")
        _collective(parser_, op=command.op)
        if command.root:
            parser_.add_argument("-r", "--root", type=int, default=0,
                                 help=f"{command.root} (default: 0)")
        for flags, options in command.options:
            parser_.add_argument(*flags, **options)
        parser_.set_defaults(func=_run_collective, collective=name)

    p2p = kinds.add_parser(
        "p2p", help="ping-pong latency and bandwidth between ranks 0 and 1 (α and β)",
        description="Ping-pong between ranks 0 and 1 for each size; prints one-way latency "
                    "and bandwidth, and the least-squares α (latency) and β (s/byte).")
    _common(p2p, default_min="1", default_max="16M")
    p2p.set_defaults(func=_run_p2p)

    from . import torch_distributed

    versus = kinds.add_parser(
        "torch-distributed", help="torch.distributed's hpctrain backend beside gloo",
        description="all_reduce, all_gather_into_tensor and reduce_scatter_tensor bus "
                    "bandwidth, and DDP's throughput, over the hpctrain backend and gloo in "
                    "one run, rounds alternated; medians. Exits 1 if any value was wrong.")
    torch_distributed.add_arguments(versus)
    versus.set_defaults(func=_run_torch_distributed)
    return parser


def _common(parser, default_min, default_max):
    parser.add_argument("-b", "--minbytes", type=_size, default=parse_size(default_min),
                        help=f"smallest size in bytes, e.g. 8, 64K (default: {default_min})")
    parser.add_argument("-e", "--maxbytes", type=_size, default=parse_size(default_max),
                        help=f"largest size in bytes, e.g. 16M (default: {default_max})")
    parser.add_argument("-f", "--stepfactor", type=int, default=2,
                        help="multiply the size by this factor each step (default: 2)")
    parser.add_argument("-n", "--iters", type=int, default=20,
                        help="timed iterations per size (default: 20)")
    parser.add_argument("-w", "--warmup", type=int, default=5,
                        help="untimed warm-up iterations per size (default: 5)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--hdf5", metavar="FILE", help="also write the results as HDF5")


def _collective(parser, op):
    """The options every collective's benchmark takes; ``op``: it reduces (``-o``)."""
    parser.add_argument("--algos", default="", metavar="A,B,...",
                        help="algorithms to compare (default: all available)")
    parser.add_argument("-c", "--check", type=int, default=1, choices=(0, 1),
                        help="check results in a separate pass (default: 1)")
    parser.add_argument("-d", "--dtype", default="float32",
                        help="float16, bfloat16, float32, float64, int32 or int64")
    if op:
        parser.add_argument("-o", "--op", default="sum", help="sum, avg, min, max or prod")
    else:
        parser.set_defaults(op="sum")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the buffers live (cuda: one GPU per local rank)")


def _size(text):
    import argparse

    from ..errors import UsageError

    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run_collective(args):
    from mpi4py import MPI

    from . import driver

    return 1 if driver.run(args.collective, args, MPI.COMM_WORLD) else 0


def _run_torch_distributed(args):
    from mpi4py import MPI

    from . import torch_distributed

    return 1 if torch_distributed.run(args, MPI.COMM_WORLD) else 0


def _run_p2p(args):
    from mpi4py import MPI

    from . import p2p

    return p2p.run(args, MPI.COMM_WORLD)
