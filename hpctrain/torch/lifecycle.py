"""``init``: the start of hpctrain.torch, above the world (:mod:`.basics`), the operations
(:mod:`.ops`) and the backends (:mod:`.backends`), which it wires together: the world's
backend (Horovod's under ``horovod``, else hpctrain's own), the engine's handler for a
joined rank's allreduce, the process sets given to ``init``. ``shutdown`` and the queries
stay in :mod:`.basics`."""


from . import basics
from .basics import World, adopt, choose_algorithm, is_initialized
from .backends import NATIVE, HorovodBackend
from .ops.allreduce import joined_allreduce
from .ops.control import register_process_sets, start_timeline
from .process_sets import ProcessSet
from .settings import ignored_message
from .settings import read as read_settings
from .. import elastic_job, faults, startup
from ..collectives import auto
from ..errors import ArgumentError
from ..log import check as check_logging
from ..log import logger
from ..mpi.init import start as start_mpi
from ..runtime import guard, launcher_rank, launcher_size

LOG = logger()


def init(comm=None, process_sets=None, allreduce=None):
    """Start hpctrain.torch over ``comm``: an mpi4py communicator (default ``COMM_WORLD``)
    or a list of ``COMM_WORLD`` ranks (a rank outside the list gets ``ValueError``).

    Synchronisation point: collective over ``comm``. MPI is started here if the script set
    ``mpi4py.rc.initialize = False`` (:func:`hpctrain.mpi.init.start`). ``process_sets``:
    :class:`ProcessSet` objects to register now (of ranks, or of the communicator each rank
    is in), or ``"dynamic"`` (sets may be added later either way). As in Horovod, a list
    that names one set twice raises ``ValueError`` on that rank with hpctrain initialized all
    the same; a second call registers nothing, only matches its list to the sets there are.
    ``allreduce`` picks the algorithm; see :mod:`hpctrain.torch.basics`. Horovod's
    ``HOROVOD_*`` variables are read here (:mod:`hpctrain.torch.settings`).

    It also installs the guard of ``python -m hpctrain`` (:func:`hpctrain.runtime.guard`): an
    exception that no code catches, on any rank, prints that rank's traceback and ends every
    rank (``MPI_Abort``), where Horovod would leave the others waiting in their next
    collective. ``HPCTRAIN_ABORT_ON_ERROR=0`` leaves ``sys.excepthook`` as it was.

    Starting MPI is bounded (:mod:`hpctrain.startup`): a rank that waits longer than
    ``HPCTRAIN_START_TIMEOUT_S`` for the others (one may have died before ``MPI_Init``,
    which nothing detects) ends, saying so. In an elastic job the bound goes on until the
    first sync of ``hvd.elastic.run``, after which the start is up.
    """
    sets = _set_list(process_sets)
    if is_initialized():
        _match_sets(basics.world(), sets)
        return
    guard()
    check_logging()                 # a bad value stops every rank alike, before MPI starts
    settings = read_settings()
    algo = choose_algorithm(allreduce, settings.hierarchical)
    faults.inject("torch.init", launcher_rank())
    startup.begin(settings.start_timeout_s, launcher_rank(), launcher_size())
    with startup.waiting("in hvd.init: MPI_Init and the world's set-up"):
        world, thread_warning = _start_world(comm, algo, settings)
    if elastic_job.state_dir() is None:
        # Outside an elastic job no first sync of hvd.elastic.run ends the start-up.
        startup.end()
    if algo == "horovod":
        world.backend = HorovodBackend(world)
        return                      # Horovod reads its own variables
    if world.rank == 0:
        for warning in (thread_warning, ignored_message(settings)):
            if warning:
                LOG.warning(warning)
    if settings.timeline and settings.timeline != "DYNAMIC":
        start_timeline(settings.timeline, settings.mark_cycles)
    if sets:
        register_process_sets(world, sets)


def _start_world(comm, algo, settings):
    """MPI started (if it was not), the world over ``comm`` made and adopted: ``(world,
    what MPI's threading lacks or None)``. Collective over ``comm``."""
    MPI, thread_warning = start_mpi()
    comm = _communicator(MPI, comm)
    if algo == "auto":
        if not auto.in_use():
            # Collective: rank 0 reads the file, and a missing one is the same error on every
            # rank, before any operation could leave a rank waiting.
            auto.use(auto.load(auto.profile_path(), comm))
    world = World(comm, algo, NATIVE, joined_allreduce, settings)
    adopt(world)
    return world, thread_warning


def _set_list(process_sets):
    sets = [] if process_sets is None or process_sets == "dynamic" else list(process_sets)
    if not all(isinstance(s, ProcessSet) for s in sets):
        raise ArgumentError(f"init(process_sets=...) takes a list of hvd.ProcessSet or "
                            f"'dynamic', got {process_sets!r}")
    return sets


def _communicator(MPI, comm):  # noqa: N803 - the module's own name
    """The communicator ``init`` runs over: ``comm``, or the group of ``COMM_WORLD`` ranks it
    lists (made by its members alone, so that the others are never waited for)."""
    if comm is None:
        return MPI.COMM_WORLD
    if isinstance(comm, MPI.Comm):
        return comm
    world = MPI.COMM_WORLD
    try:
        ranks = [int(r) for r in comm]
    except (TypeError, ValueError):
        ranks = None
    if not ranks or len(set(ranks)) != len(ranks) or \
            not all(0 <= r < world.Get_size() for r in ranks):
        raise ArgumentError(f"init(comm=...) takes an mpi4py communicator or a list of "
                            f"distinct COMM_WORLD ranks from 0 to {world.Get_size() - 1}, got "
                            f"{comm!r}: e.g. init(comm=[0, 1])")
    if world.Get_rank() not in ranks:
        raise ArgumentError(f"rank {world.Get_rank()} is not in init(comm={ranks}): only the "
                            f"listed ranks may call it")
    return world.Create_group(world.Get_group().Incl(ranks))


def _match_sets(w, sets):
    """A second ``init``: give each set of ``sets`` the number of the registered set of
    its ranks, without any collective; ``ValueError`` for one that is not registered or is
    named twice."""
    taken = {0}                     # the global set is never named again
    for index, pset in enumerate(sets):
        members = w.resolve_ranks(pset)
        found = next((s for s in w.sets.values() if s.ranks == list(members)), None)
        if found is None or found.process_set_id in taken:
            why = "is not registered (add it with hvd.add_process_set on every rank)" \
                if found is None else "is a duplicate (of another entry or the global set)"
            raise ArgumentError(f"process_sets entry {index} ({pset}) {why}")
        taken.add(found.process_set_id)
        if pset is not found:
            pset._register(found.process_set_id, list(members), found.comm, w.rank)
