"""How a rank waits inside MPI: spinning on its core, or yielding it between polls of the
network (Open MPI's ``mpi_yield_when_idle``), chosen before ``MPI_Init`` from the ranks of
the node and the cores this process may run on (:func:`apply_wait_policy`, which
``import hpctrain`` calls), and said in words for ``hpctrain info`` and the benchmarks'
headers (:func:`describe_waiting`)."""

import os

#: Open MPI's setting for how a rank waits inside MPI: ``1`` yields its core
#: (``sched_yield``) between polls of the network, ``0`` spins on it.
YIELD_WHEN_IDLE = "OMPI_MCA_mpi_yield_when_idle"
#: Where launchers say how many ranks of the job run on this node: Open MPI's mpirun,
#: MPICH's Hydra, Slurm (with ``--ntasks-per-node``).
LOCAL_SIZE_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE")
#: Set beside :data:`YIELD_WHEN_IDLE` when hpctrain chose it, with the reason: a launch
#: started from this process (``hpctrain.launch``) drops both, its ranks decide afresh.
WAIT_POLICY = "HPCTRAIN_WAIT_POLICY"


def local_ranks(environ):
    """How many ranks of this job run on this node, as the launcher says (``None``: unknown)."""
    for name in LOCAL_SIZE_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def wait_policy(environ, cores):
    """``(yield_when_idle, why)``: whether ranks should yield their core while MPI waits.

    Every rank of hpctrain.torch (and of Horovod) runs two busy threads: the one computing
    and the communication thread. A rank that waits in MPI spins on a core by default,
    which is right when every thread has a core of its own; when the node's ranks times two
    outnumber the ``cores`` this process may run on, the spinning thread takes the core from
    backward, of its own rank or another's (docs/training.md measures it). Open MPI yields
    by itself only when it counts more ranks than slots, which it never does for threads.
    ``yield_when_idle`` is ``None`` when the user has set the variable (theirs wins) or the
    number of local ranks is unknown.
    """
    if YIELD_WHEN_IDLE in environ:
        return None, environ.get(WAIT_POLICY, "set by the user")
    ranks = local_ranks(environ)
    if ranks is None:
        return None, "ranks per node unknown: Open MPI's default"
    threads = 2 * ranks
    why = f"{ranks} rank(s) on this node x 2 busy threads {'>' if threads > cores else '<='} " \
          f"{cores} core(s)"
    return threads > cores, why


def apply_wait_policy(environ=None, cores=None):
    """Set :data:`YIELD_WHEN_IDLE` to ``1`` in ``environ`` (default ``os.environ``, before
    ``MPI_Init`` reads it) when :func:`wait_policy` says so (otherwise Open MPI's default
    stands); return its ``(decision, why)``."""
    environ = os.environ if environ is None else environ
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    decision, why = wait_policy(environ, cores)
    if decision:
        environ[YIELD_WHEN_IDLE] = "1"
        environ[WAIT_POLICY] = why
    return decision, why


def describe_waiting(environ=None):
    """How this process's MPI waits, in words (for ``hpctrain info`` and benchmark headers)."""
    environ = os.environ if environ is None else environ
    value = environ.get(YIELD_WHEN_IDLE)
    if value is None:
        return "Open MPI's default (spins unless it counts more ranks than slots)"
    mode = {"1": "yields the core", "0": "spins"}.get(value, "as Open MPI reads it")
    return f"{mode} (mpi_yield_when_idle={value}: {environ.get(WAIT_POLICY, 'set by the user')})"
