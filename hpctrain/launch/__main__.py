"""``python -m hpctrain.launch``: run a command under this machine's ``mpirun``
(:mod:`hpctrain.launch`), or, with ``--elastic`` first, keep it going when ranks are lost
(:mod:`hpctrain.launch.elastic`)."""

import os
import sys

from . import find_mpirun, launch_environment, mpirun_command, split_options
from . import elastic

USAGE = ("usage: python -m hpctrain.launch -np N [MPIRUN OPTIONS --] COMMAND...\n"
         "       python -m hpctrain.launch --elastic [ELASTIC OPTIONS] [MPIRUN OPTIONS --] "
         "COMMAND...   (--elastic --help for its options)")


def main(argv=None):
    """``python -m hpctrain.launch -np N [MPIRUN OPTIONS --] COMMAND...``: exec mpirun;
    ``python -m hpctrain.launch --elastic ...``: :func:`hpctrain.launch.elastic.main`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--elastic"]:
        sys.exit(elastic.main(argv[1:]))
    if len(argv) < 3 or argv[0] not in ("-np", "-n") or not argv[1].isdigit():
        sys.exit(USAGE)
    if argv[2] == "--elastic":
        sys.exit("python -m hpctrain.launch: --elastic comes first: "
                 f"python -m hpctrain.launch --elastic {argv[0]} {argv[1]} ...")
    np = int(argv[1])
    try:
        extra, command = split_options(argv[2:])
    except ValueError as exc:
        sys.exit(f"python -m hpctrain.launch: {exc}\n{USAGE}")
    if not command:
        sys.exit("python -m hpctrain.launch: no command to launch")
    try:
        mpirun = find_mpirun()
    except FileNotFoundError as exc:
        sys.exit(str(exc))
    full = mpirun_command(np, command, mpirun=mpirun, extra=extra, tty=sys.stdout.isatty())
    os.execve(mpirun, full, launch_environment())


if __name__ == "__main__":
    main()
