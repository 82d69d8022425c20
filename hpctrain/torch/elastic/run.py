"""``hvd.elastic.run``: call the training function again, from the last commit, after every
failure, on the ranks that are left.

Before each attempt the state is synced from rank 0. Then:

- a rank died (:class:`~hpctrain.torch.engine.ProcessFailure`, on an MPI with fault
  tolerance): every survivor restores its last commit, the world is shrunk to the survivors
  (``MPI_Comm_shrink``) and ``hpctrain.torch`` starts again on it, with the same algorithm
  and the process sets whose ranks all survived; the reset callbacks run and the next
  attempt syncs the state from the new rank 0. Fewer ranks than ``HPCTRAIN_ELASTIC_MIN_NP``
  end the job (exit status ``EXIT_TOO_FEW``) with one message;
- another :class:`HorovodInternalError` (an operation failed on every rank): restore, shut
  down, start again on the same ranks, as Horovod does;
- :class:`HostsUpdatedInterrupt` at a commit: in a job of the elastic launcher (a state
  folder is set), every rank exits with ``EXIT_HOSTS_UPDATED`` and the launcher starts the
  job again on the new hosts from the commit just written (a process cannot join a running
  MPI job's world); without a launcher the world is started again as it is.

A restarted job (the launcher's next start, after any failure on an MPI without fault
tolerance) begins from the state rank 0 wrote at the last commit.
"""

import functools
import sys

from ... import elastic_job
from ... import startup
from ..backends import NATIVE
from ..basics import abandon, is_initialized, shutdown, world
from ..engine import HorovodInternalError, ProcessFailure
from ..lifecycle import init
from . import in_place
from .state import HostsUpdatedInterrupt
from ...log import logger

LOG = logger("hpctrain.elastic")

#: Resets in a row without a commit between them after which run gives up: a failure that
#: comes back at once is not one the job can train through.
MAX_RESETS_WITHOUT_COMMIT = 5


def run(func):
    """Decorate ``func(state, *args, **kwargs)`` so that it goes on through failures (see
    the module's documentation). ``func`` must not make a collective before its first
    ``state.commit`` that the state's sync would not also make: after a reset, ranks begin
    again together at the sync."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if world().backend is not NATIVE:
            raise ValueError("hvd.elastic.run needs hpctrain's own engine; with "
                             "HPCTRAIN_ALLREDUCE=horovod every call goes to Horovod, whose "
                             "elastic mode needs horovodrun and Gloo")
        _resume(state)
        state.running += 1
        try:
            return _attempts(state, func, args, kwargs)
        finally:
            state.running -= 1
    return wrapper


def _attempts(state, func, args, kwargs):
    sync, resets, up = True, 0, False
    while True:
        commits = state.commits
        try:
            if sync and not up:
                _first_sync(state)
                up = True
            elif sync:
                state.sync()
            return func(state, *args, **kwargs)
        except ProcessFailure:
            state.restore()
            _shrink()
            sync = True
        except HorovodInternalError:
            state.restore()
            _start_again()
            sync = True
        except HostsUpdatedInterrupt as interrupt:
            if elastic_job.state_dir() is not None:
                _exit_for_new_hosts()
            _start_again()
            sync = not interrupt.skip_sync
        resets = resets + 1 if state.commits == commits else 1
        if resets > MAX_RESETS_WITHOUT_COMMIT:
            raise HorovodInternalError(
                f"hvd.elastic.run: {resets} resets in a row without a commit between them: "
                f"the failure comes back at once; giving up")
        state.on_reset()


def _first_sync(state):
    """Sync the state from rank 0 for the first time, which ends the start-up: its wait
    counts against the start-up bound (:mod:`hpctrain.startup`), and after it the start is
    up (:func:`hpctrain.elastic_job.log_up`)."""
    with startup.waiting("in the first sync of the state, in hvd.elastic.run"):
        state.sync()
    startup.end()
    elastic_job.log_up(world().rank, np=world().size)


def _resume(state):
    """Rank 0 reads the last commit of an earlier start of this job, if there is one; the
    first sync then gives it to every rank."""
    folder = elastic_job.state_dir()
    if folder is None or not (folder / elastic_job.STATE_FILE).exists() or world().rank != 0:
        return
    state.read(folder / elastic_job.STATE_FILE)
    elastic_job.log_event(folder, "resumed", size=world().size)
    LOG.info(f"resuming from the commit in {folder / elastic_job.STATE_FILE}")


def _shrink():
    """The survivors' world: revoke, shrink, start hpctrain.torch again on it
    (:func:`.in_place.recover`). Collective over the survivors (each one gets here from its
    own failed operation)."""
    old = world()
    old.revoke()            # a rank that learnt of the death from its caller's side, too
    abandon()
    in_place.recover(old.user_comm, lambda comm: _start_on(comm, old))


def _start_on(comm, old):
    """``init`` on ``comm`` with ``old``'s algorithm and every process set of ``old`` whose
    ranks are all in ``comm`` (renumbered); a set that lost a rank is left unregistered,
    and says so when used."""
    from mpi4py import MPI

    survivors = comm.Get_group()
    before = old.user_comm.Get_group()
    sets = []
    for set_id, pset in sorted(old.sets.items()):
        if set_id == 0:
            continue
        ranks = MPI.Group.Translate_ranks(before, pset.ranks, survivors)
        pset._forget()
        if MPI.UNDEFINED in ranks:
            lost = [r for r, n in zip(pset.ranks, ranks) if n == MPI.UNDEFINED]
            pset.lost = (f"{pset} lost rank(s) {lost} when the world shrank after a "
                         f"failure; add a new process set of the ranks that are left")
        else:
            pset.ranks, pset.mpi_comm = sorted(ranks), None
            sets.append(pset)
    try:
        init(comm=comm, allreduce=old.algo, process_sets=sets)
    except BaseException as exc:
        # Another rank died while the world started again: no survivor may wait in it
        # when they shrink again.
        if in_place.lost_rank(exc) and is_initialized():
            world().revoke()
            abandon()
        raise


def _start_again():
    """Shut down and start again on the same ranks (same algorithm and process sets)."""
    old = world()
    sets = [pset for set_id, pset in sorted(old.sets.items()) if set_id]
    shutdown()
    for pset in sets:
        pset._forget()
    init(comm=old.user_comm, allreduce=old.algo, process_sets=sets)


def _exit_for_new_hosts():
    """Every rank ends with ``EXIT_HOSTS_UPDATED`` (the commit that raised it has been
    written): the launcher starts the job again on the new hosts."""
    if world().rank == 0:
        LOG.info("new hosts: ending this start so that the launcher starts the job again on "
                 "them, from the last commit")
    shutdown()
    sys.exit(elastic_job.EXIT_HOSTS_UPDATED)


__all__ = ["run"]
