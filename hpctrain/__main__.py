"""Entry point of ``python -m hpctrain`` and of the ``hpctrain`` console script."""

import sys

from . import log
from .cli import parse_args
from .runtime import run_guarded


def main(argv=None):
    """Parse the command line and run the subcommand; a failure on any rank ends the job."""
    args = parse_args(argv)
    return run_guarded(_checked(args.func), args)


def _checked(func):
    def run(args):
        log.check()             # a bad HPCTRAIN_LOG_LEVEL or _RANKS is bad input
        return func(args)
    return run


if __name__ == "__main__":
    sys.exit(main())
