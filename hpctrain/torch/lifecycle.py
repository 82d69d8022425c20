"""``init``: the start of hpctrain.torch, above the world (:mod:`.basics`), the operations
(:mod:`.ops`) and the Horovod backend, which it wires together: the engine's handler for a
joined rank's allreduce, the process sets given to ``init``, Horovod under ``horovod``.
``shutdown`` and the queries stay in :mod:`.basics`."""

from .basics import World, adopt, choose_algorithm, is_initialized
from .horovod_backend import HorovodBackend
from .ops.allreduce import joined_allreduce
from .ops.control import add_process_set
from .process_sets import ProcessSet
from ..collectives import auto
from ..runtime import guard


def init(comm=None, process_sets=None, allreduce=None):
    """Start hpctrain.torch over ``comm`` (an mpi4py communicator, default ``COMM_WORLD``).

    Synchronisation point: collective over ``comm``. A second call does nothing (as in
    Horovod). ``process_sets``: :class:`ProcessSet` objects to register now, in order (the
    same on every rank), or ``"dynamic"`` (sets may be added later either way).
    ``allreduce`` picks the algorithm; see :mod:`hpctrain.torch.basics`.

    It also installs the guard of ``python -m hpctrain`` (:func:`hpctrain.runtime.guard`): an
    exception that no code catches, on any rank, prints that rank's traceback and ends every
    rank (``MPI_Abort``), where Horovod would leave the others waiting in their next
    collective. ``HPCTRAIN_ABORT_ON_ERROR=0`` leaves ``sys.excepthook`` as it was.
    """
    if is_initialized():
        return
    guard()
    algo = choose_algorithm(allreduce)
    from mpi4py import MPI

    if isinstance(comm, (list, tuple)):
        raise NotImplementedError("init(comm=[ranks]) (a subset of ranks) is not supported: "
                                  "pass an mpi4py communicator made with Comm.Split, or use "
                                  "process sets (init(process_sets=[hvd.ProcessSet(ranks)]))")
    sets = [] if process_sets in (None, "dynamic") else list(process_sets)
    if not all(isinstance(s, ProcessSet) for s in sets):
        raise ValueError(f"init(process_sets=...) takes a list of hvd.ProcessSet, got "
                         f"{process_sets!r}")
    comm = MPI.COMM_WORLD if comm is None else comm
    if algo == "auto":
        if not auto.in_use():
            # Collective: rank 0 reads the file, and a missing one is the same error on every
            # rank, before any operation could leave a rank waiting.
            auto.use(auto.load(auto.profile_path(), comm))
    world = World(comm, algo, joined_allreduce)
    adopt(world)
    if algo == "horovod":
        world.hvd = HorovodBackend(world)
    for pset in sets:
        add_process_set(pset)
