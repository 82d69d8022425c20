"""The ``hpctrain`` command line: one parser, one module per subcommand."""

import argparse
import contextlib
import os

from . import __version__, info
from .options import Parser
from .bench import cli as bench
from .data import cli as data
from .runtime import launcher_rank
from .study import cli as study
from .train import cli as train

#: Subcommand modules, each with ``add_parser(subparsers)``; the order is the help's order.
SUBCOMMANDS = (train, info, bench, study, data)

DESCRIPTION = """\
Data-parallel training on HPC clusters with MPI and Horovod, and the allreduce algorithms
to compare. Launch every subcommand under MPI, one process per rank:

  mpirun -np 4 python -m hpctrain train       # train the default model (digits MLP)
  mpirun -np 4 python -m hpctrain info        # check the launch: ranks, hosts, libraries
  mpirun -np 4 python -m hpctrain bench allreduce -e 16M   # compare allreduce algorithms
  mpirun -np 2 python -m hpctrain bench p2p   # latency and bandwidth between two ranks
  srun --mpi=pmix python -m hpctrain info     # the same inside a Slurm allocation

Without a launcher a subcommand runs as a single rank. If any rank fails, the whole job
ends (MPI_Abort) with that rank's traceback instead of hanging.
"""


def build_parser():
    """The argument parser with every subcommand registered."""
    parser = Parser(
        prog="hpctrain", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"hpctrain {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def parse_args(argv=None):
    """Parse ``argv``; only rank 0 prints help and usage errors, every rank exits alike.

    Parsing happens before MPI is initialised, so that ``--help`` and bad options cost no
    MPI start-up; the rank comes from the launcher's environment.
    """
    parser = build_parser()
    if launcher_rank() == 0:
        return parser.parse_args(argv)
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), \
            contextlib.redirect_stderr(null):
        return parser.parse_args(argv)
