"""``hpctrain train``: read the configuration, then run the training loop on every rank."""

import argparse
import os

from ..errors import UsageError
from ..runtime import agree
from .build import check_without_torch
from .config import describe_keys, load_config, parse_overrides

DESCRIPTION = """\
Train a model data-parallel over all ranks. Every rank reads its own share of each global
batch from HDF5, gradients are averaged (or served) as --regime and --allreduce say, and
rank 0 prints one line per epoch and writes runs/<name>/metrics.csv.

  mpirun -np 4 python -m hpctrain train                    # the digits MLP, the defaults
  mpirun -np 4 python -m hpctrain train --allreduce=ring --epochs 5
  mpirun -np 4 python -m hpctrain train --config configs/digits.toml --resume
"""

EPILOG = f"""\
configuration keys (in a TOML file as key = value, or as --key=value / --key value):
{describe_keys()}

Values: defaults < environment ($HPCTRAIN_ALLREDUCE, $HPCTRAIN_ALLREDUCE_PROFILE) <
--config FILE < command line. --batch-size is per rank.
"""


class _KeepOverrides(argparse.ArgumentParser):
    """A parser that hands unknown ``--key=value`` options to the configuration.

    argparse would reject them with a bare "unrecognized arguments"; the configuration
    rejects unknown keys itself, naming every valid one.
    """

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        namespace.overrides = rest
        return namespace, []


def add_parser(subparsers):
    """Register the ``train`` subcommand."""
    parser = subparsers.add_parser(
        "train", help="train a model data-parallel (digits MLP by default)",
        description=DESCRIPTION, epilog=EPILOG, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    # The subparsers action builds every subparser with the parent's class; only this one
    # must keep what it does not recognise.
    parser.__class__ = _KeepOverrides
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    parser.set_defaults(func=run, overrides=[])
    return parser


def run(args):
    """Build the configuration (on every rank, before any collective), check it and train.

    A rank that cannot build it (a bad option, a configuration file unreadable on its node),
    or whose configuration or data fails the checks that need no torch, joins the first
    collective of ``train``, the start-up verdict, with its problem, without importing torch
    (1.4 s of CPU per rank): the ranks that passed run the whole checks and agree with it
    there, so every rank ends the same way.
    """
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        config = load_config(args.config, parse_overrides(args.overrides), os.environ)
        check_without_torch(config, world.Get_rank(), world.Get_size())
    except UsageError as exc:
        agree(world, exc)
        raise  # not reached: agree raised the Verdict
    from .loop import train

    train(config)
    return 0
