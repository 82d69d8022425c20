"""``hpctrain bench``: one benchmark per collective plug-in (``blocks.PLUGINS``: allreduce,
allgather, reducescatter, alltoall, broadcast, reduce), all run by one driver, and the
point-to-point and ``torch.distributed`` benchmarks."""

from ..options import add_arguments
from .blocks import PLUGINS
from .config import CollectiveBench, RootedBench, SizeSweep


def add_parser(subparsers):
    """Register one command per collective of ``blocks.PLUGINS`` (its command line is the
    plug-in's ``command``), ``p2p`` and ``torch-distributed``."""
    parser = subparsers.add_parser(
        "bench", help="benchmarks: allreduce algorithms side by side, point-to-point α/β",
        description="Benchmarks modelled on nccl-tests. Run under mpirun, e.g. "
                    "mpirun -np 4 python -m hpctrain bench allreduce -b 8 -e 64M -f 4")
    kinds = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")

    for name, plugin in PLUGINS.items():
        _add_collective(kinds, name, plugin.command)

    p2p = kinds.add_parser(
        "p2p", help="ping-pong latency and bandwidth between ranks 0 and 1 (α and β)",
        description="Ping-pong between ranks 0 and 1 for each size; prints one-way latency "
                    "and bandwidth, and the least-squares α (latency) and β (s/byte).")
    add_arguments(p2p, SizeSweep, defaults={"minbytes": "1", "maxbytes": "16M"})
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


def _add_collective(kinds, name, command):
    """``bench NAME``: its options, generated from :class:`~.config.CollectiveBench` (with
    ``-o`` where it reduces, ``-r`` where it has a root), and its plug-in's own."""
    parser = kinds.add_parser(
        name, help=f"time every {name} algorithm per size ({command.moves}); check the "
                   f"results",
        description=f"Time each {name} algorithm at each size on the same "
                    f"{command.buffers}, side by side. Prints a #-header (settings, "
                    f"versions, rank map), one row per size and algorithm (time "
                    f"min/avg/max over ranks, algbw, busbw, #wrong) and a footer; "
                    f"{command.size}. Exits 1 if any value was wrong.")
    add_arguments(parser, RootedBench if command.root else CollectiveBench,
                  defaults={"minbytes": command.smallest}, skip=() if command.op else ("op",),
                  helps={"root": f"{command.root} (default: {{default}})"})
    for flags, options in command.options:
        parser.add_argument(*flags, **options)
    parser.set_defaults(func=_run_collective, collective=name)


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
