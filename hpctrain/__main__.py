"""Entry point of ``python -m hpctrain`` and of the ``hpctrain`` console script."""

import sys

from .cli import parse_args
from .runtime import run_guarded


def main(argv=None):
    """Parse the command line and run the subcommand; a failure on any rank ends the job."""
    args = parse_args(argv)
    return run_guarded(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
