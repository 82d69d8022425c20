"""How ``dist.init_process_group("hpctrain")`` needs no ``MASTER_ADDR``, ``RANK`` or store.

torch asks every backend for a rendezvous: with no ``store=`` and no ``init_method=``,
``init_process_group`` takes ``env://``, whose handler reads ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` and connects a ``TCPStore``. The ``hpctrain`` backend
needs none of it: its ranks meet through MPI. Importing :mod:`hpctrain.torch.distributed`
puts :func:`env_rendezvous` in front of torch's ``env://`` handler:

- with ``MASTER_ADDR`` or ``MASTER_PORT`` set, torch's own handler runs, as before, for any
  backend;
- without them (where torch's handler would fail), MPI starts (at
  ``MPI_THREAD_MULTIPLE``), rank and size come from ``COMM_WORLD``, and the store is a
  :class:`MPIWorldStore`: a placeholder that the ``hpctrain`` backend ignores. A
  ``RANK`` or ``WORLD_SIZE`` that disagrees with MPI is the same error on every rank
  (status 2). Another backend (gloo) that would use this store gets an error naming the two
  variables it needs instead of a store that never meets the other ranks.
"""

import importlib
import os
from urllib.parse import parse_qsl, urlparse

import torch.distributed as dist

from ...errors import UsageError

#: The variables that say the user chose torch's own TCP rendezvous.
TCP_VARIABLES = ("MASTER_ADDR", "MASTER_PORT")


class MPIWorldStore(dist.Store):
    """The store of a rendezvous made by MPI: the ``hpctrain`` backend needs no store, and
    any use of this one (by another backend, or by torch's ``TORCH_DIST_INIT_BARRIER``)
    raises, saying what to set instead."""

    def __init__(self):
        super().__init__()

    def set_timeout(self, timeout):
        """Accepted and ignored (torch sets it on every store)."""

    def _refuse(self, *args, **kwargs):
        raise RuntimeError(
            "this process group was set up by hpctrain's MPI rendezvous, which has no store: "
            "only the 'hpctrain' backend runs without one. For gloo or another backend, set "
            "MASTER_ADDR and MASTER_PORT (torch's env:// rendezvous), or use "
            "hpctrain.torch.init_process_group(), which sets up a store through MPI")

    set = get = add = wait = check = compare_set = delete_key = num_keys = _refuse
    append = multi_get = multi_set = queue_push = queue_pop = queue_len = _refuse


def world_from_mpi(given):
    """``(rank, size)`` of ``COMM_WORLD``, with MPI started if it was not; a
    :class:`~hpctrain.errors.Verdict` on every rank if ``given`` (``{"rank": ...,
    "world_size": ...}``: what ``RANK``, ``WORLD_SIZE`` or ``init_process_group``'s arguments
    said, ``-1`` for nothing) disagrees with MPI. Installs the guard of
    :func:`hpctrain.runtime.guard` first, so that bad input ends every rank (status 2 at
    size 1) instead of leaving any waiting.

    Synchronisation point: one allgather over ``COMM_WORLD`` (:func:`hpctrain.runtime.checks`).
    """
    from ... import mpi_support
    from ...runtime import checks, guard

    guard()
    MPI, _ = mpi_support.start()  # noqa: N806 - mpi4py's module name
    comm = MPI.COMM_WORLD
    mpi = {"rank": comm.Get_rank(), "world_size": comm.Get_size()}
    with checks(comm):
        for key, variable in (("world_size", "WORLD_SIZE"), ("rank", "RANK")):
            value = int(given.get(key, -1))
            if value != -1 and value != mpi[key]:
                raise UsageError(
                    f"{variable} (or {key}=) is {value}, but MPI started {mpi['world_size']} "
                    f"rank(s) and this is rank {mpi['rank']}: the hpctrain backend takes rank "
                    f"and size from the MPI launcher (mpirun -np N, srun); unset {variable} "
                    f"and pass no {key}=, or launch with a matching -np")
    return mpi["rank"], mpi["world_size"]


def env_rendezvous(url, timeout=None, **kwargs):
    """``env://`` as torch's, unless neither ``MASTER_ADDR`` nor ``MASTER_PORT`` is set:
    then rank and size from MPI and an :class:`MPIWorldStore` (see the module docstring)."""
    if any(os.environ.get(v) for v in TCP_VARIABLES):
        if timeout is not None:
            kwargs["timeout"] = timeout
        yield from _TORCH_ENV(url, **kwargs)
        return
    given = dict(parse_qsl(urlparse(url).query))
    rank, size = world_from_mpi(given)
    yield MPIWorldStore(), rank, size
    raise RuntimeError("hpctrain's MPI rendezvous cannot be repeated (a world has one size)")


# The module, not the function of that name that torch.distributed exports.
_HANDLERS = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
_TORCH_ENV = _HANDLERS["env"]


def install():
    """Put :func:`env_rendezvous` in front of torch's ``env://`` handler (once)."""
    _HANDLERS["env"] = env_rendezvous
