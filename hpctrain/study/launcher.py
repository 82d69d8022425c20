"""Starting the benchmarks of a study: local mpirun, srun inside an allocation, or any prefix.

The study itself is one process; it launches one MPI job per rank count and reads the JSON
that the job's rank 0 writes. Every launch has a time limit.
"""

import os
import shlex
import sys

from ..errors import UsageError
from ..launch import launch_environment, mpirun_command, run_bounded, srun_command


def command(launcher, ranks, argv):
    """The argv that starts ``argv`` on ``ranks`` ranks with ``launcher``.

    ``local``: this machine's mpirun with the flags of :func:`hpctrain.launch.mpirun_command`
    (``--allow-run-as-root`` as root, ``--oversubscribe``, ``--bind-to none``);
    ``srun``: :func:`hpctrain.launch.srun_command`, inside a Slurm allocation;
    anything else is a command prefix that takes ``-np N`` (for example
    ``scripts/vcluster mpirun``).
    """
    if launcher == "local":
        return mpirun_command(ranks, argv)
    if launcher == "srun":
        if "SLURM_JOB_ID" not in os.environ:
            raise UsageError("--launcher srun needs a Slurm allocation (salloc or sbatch)")
        return srun_command(ranks, argv)
    return [*shlex.split(launcher), "-np", str(ranks), *argv]


def run(launcher, ranks, argv, timeout):
    """Run one launch and return its stdout; raise ``RuntimeError`` with its output if it
    fails, or ``hpctrain.launch.LaunchHung`` (a ``RuntimeError``) if it hangs."""
    full = command(launcher, ranks, argv)
    # On a hang, run_bounded kills the launch with its ranks: Open MPI gives each local rank
    # a process group of its own, which outlives a killed mpirun.
    done = run_bounded(full, timeout, env=launch_environment(), merge_stderr=False)
    if done.returncode != 0:
        raise RuntimeError(f"`{shlex.join(full)}` exited with {done.returncode}:\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def hpctrain(*args):
    """argv running ``python -m hpctrain ARGS`` with this interpreter."""
    return [sys.executable, "-m", "hpctrain", *map(str, args)]
