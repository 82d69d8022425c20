"""Recovery in place: how an elastic job goes on without a lost rank on an MPI with fault
tolerance (ULFM), the one way for ``hvd.elastic.run`` and ``hpctrain train --elastic``.

Each survivor learns of the death from its own failed operation (:func:`lost_rank`) and
revokes every communicator it was using, so that no survivor is left waiting in one. Then,
collectively over the survivors, :func:`recover` shrinks the communicator to them
(:func:`survivors`, which also ends the job when too few are left) and makes the attempt
again on the survivors' communicator, shrinking again if another rank dies meanwhile.
"""

import sys

from ... import elastic_job
from ...log import logger, set_rank
from ...mpi import ulfm
from ..engine import ProcessFailure

LOG = logger("hpctrain.elastic")


def lost_rank(exc):
    """True when ``exc`` says that a rank died: an operation of hpctrain.torch's engine
    (:class:`~hpctrain.torch.engine.ProcessFailure`) or MPI's own report
    (:func:`hpctrain.mpi.ulfm.process_failure`; only an MPI with fault tolerance says so)."""
    return isinstance(exc, ProcessFailure) or ulfm.process_failure(exc)


def survivors(comm):
    """The survivors of ``comm`` after a rank died: ``comm`` revoked and shrunk
    (:func:`hpctrain.mpi.ulfm.shrink`). Collective over the survivors, each of which arrives
    from its own failed operation. When fewer ranks than ``HPCTRAIN_ELASTIC_MIN_NP`` are left,
    every survivor exits with ``EXIT_TOO_FEW`` after one message from the new rank 0."""
    before = comm.Get_size()
    shrunk = ulfm.shrink(comm)
    size, rank = shrunk.Get_size(), shrunk.Get_rank()
    set_rank(rank)                          # the survivors' rank 0 logs from now on
    least = elastic_job.int_setting(elastic_job.ENV_MIN_NP, 1)
    if rank == 0:
        elastic_job.log_event(elastic_job.state_dir(), "shrunk", before=before, after=size)
        if size >= least:
            LOG.info(f"lost {before - size} rank(s): going on with {size} of {before} from "
                     f"the last commit")
        else:
            LOG.error(f"lost {before - size} rank(s); {size} left is fewer than the minimum "
                      f"of {least} ({elastic_job.ENV_MIN_NP}, --min-np): ending the job")
    if size < least:
        sys.exit(elastic_job.EXIT_TOO_FEW)
    return shrunk


def recover(comm, attempt):
    """After a rank of ``comm`` died: ``attempt(shrunk)`` on the survivors' communicator
    (:func:`survivors`), and what it returns.

    Collective over the survivors, each of which arrives from its own failed operation,
    having revoked what it was using. An attempt that fails because another rank died
    (:func:`lost_rank`) must have revoked what it started, as the first failure did: then the
    survivors shrink again and make it again. Any other exception is raised.
    """
    for _ in range(comm.Get_size()):        # each failure takes at least one rank
        comm = survivors(comm)
        try:
            return attempt(comm)
        except BaseException as exc:
            if not lost_rank(exc):
                raise
    raise AssertionError("not reached: a rank is always left, or the job has ended")


__all__ = ["lost_rank", "recover", "survivors"]
