"""``python -m hpctrain.launch``: run a command under this machine's ``mpirun``
(:mod:`hpctrain.launch`), or, with ``--elastic`` first, keep it going when ranks are lost
(:mod:`hpctrain.launch.elastic`).

The ranks' output passes through :mod:`hpctrain.launch.output`: untagged unless
``--tag-output`` comes first (this is the local mpirun behind ``scripts/mpirun`` and
``scripts/run``, whose output people and scripts read as mpirun's), and ending, when a rank
failed, with one root-cause block.
"""

import sys

from . import find_mpirun, launch_environment, mpirun_command, output, split_options
from . import elastic

NAME = "python -m hpctrain.launch"
USAGE = ("usage: python -m hpctrain.launch [--tag-output | --no-tag-output] -np N "
         "[MPIRUN OPTIONS --] COMMAND...\n"
         "       python -m hpctrain.launch --elastic [ELASTIC OPTIONS] [MPIRUN OPTIONS --] "
         "COMMAND...   (--elastic --help for its options)")


def main(argv=None):
    """``python -m hpctrain.launch [--tag-output] -np N [MPIRUN OPTIONS --] COMMAND...``:
    mpirun, its output relayed (:func:`hpctrain.launch.output.run`), its exit status;
    ``python -m hpctrain.launch --elastic ...``: :func:`hpctrain.launch.elastic.main`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--elastic"]:
        sys.exit(elastic.main(argv[1:]))
    tag = False
    while argv[:1] in (["--tag-output"], ["--no-tag-output"]):
        tag = argv.pop(0) == "--tag-output"
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
    sys.exit(output.run(full, launch_environment(), tag=tag, name=NAME))


if __name__ == "__main__":
    main()
