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
import sys
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

    def clone(self):
        """Itself (NCCL's monitoring thread clones the store it was given)."""
        return self


#: Every :class:`MPIWorldStore` handed to torch, kept alive for the process: torch holds
#: them from C++ only (its ``PrefixStore``), and a Python store whose Python object has been
#: collected no longer answers C++ with its own methods (``set`` then fails with torch's
#: ``INTERNAL ASSERT FAILED ... Not implemented``, as ``new_group(backend="nccl")`` did,
#: instead of saying what to set).
HANDED_OUT = []


def world_from_mpi(given):
    """``(rank, size)`` of ``COMM_WORLD``, with MPI started if it was not; a
    :class:`~hpctrain.errors.Verdict` on every rank if ``given`` (``{"rank": ...,
    "world_size": ...}``: what ``RANK``, ``WORLD_SIZE`` or ``init_process_group``'s arguments
    said, ``-1`` for nothing) disagrees with MPI: rank 0 prints it once and every rank exits
    with status 2 (:func:`hpctrain.runtime.end_job`; raised instead where
    ``HPCTRAIN_ABORT_ON_ERROR=0`` keeps hpctrain's guard off).

    Synchronisation point: one allgather over ``COMM_WORLD`` (:func:`hpctrain.runtime.checks`).
    """
    from ...errors import Verdict
    from ...mpi.init import start as start_mpi
    from ...runtime import checks, end_job, guard

    guarded = guard()
    MPI, short = start_mpi()  # noqa: N806 - mpi4py's module name
    comm = MPI.COMM_WORLD
    mpi = {"rank": comm.Get_rank(), "world_size": comm.Get_size()}
    try:
        with checks(comm):
            if short:
                raise UsageError(thread_level_problem(short))
            for key, variable in (("world_size", "WORLD_SIZE"), ("rank", "RANK")):
                value = int(given.get(key, -1))
                if value not in (-1, mpi[key]):
                    raise UsageError(mismatch(key, variable, value, mpi))
    except Verdict as verdict:
        if not guarded:
            raise
        end_job(verdict)    # rank 0 says it once; every rank exits with status 2
    return mpi["rank"], mpi["world_size"]


def thread_level_problem(short):
    """The message for an MPI started below ``MPI_THREAD_MULTIPLE`` (``short``: what
    :func:`hpctrain.mpi.init.start` said)."""
    return (f"the hpctrain backend needs MPI_THREAD_MULTIPLE (its communication thread, its "
            f"point-to-point thread and the caller's all call MPI at once), and {short}; "
            f"remove mpi4py.rc.thread_level or an earlier MPI.Init_thread from the script, or "
            f"use an MPI built with thread support")


def mismatch(key, variable, value, mpi):
    """The message for ``RANK``/``WORLD_SIZE`` (``variable``) given as ``value`` where MPI
    says ``mpi[key]``."""
    if key == "world_size":
        return (f"WORLD_SIZE (or world_size=) is {value}, but MPI started {mpi[key]} rank(s): "
                f"the hpctrain backend takes rank and size from the MPI launcher (mpirun -np "
                f"N, srun); unset WORLD_SIZE and pass no world_size=, or launch {value} ranks")
    return (f"RANK (or rank=) is {value}, but MPI says this process is rank {mpi[key]}: the "
            f"hpctrain backend takes rank and size from the MPI launcher; unset RANK and "
            f"pass no rank=")


def c10d_local(function, variable):
    """The local ``variable`` of torch's ``distributed_c10d.function`` somewhere up this
    call's stack (``None`` where there is no such frame, or no such variable): what torch
    knows there and does not hand on (the backend asked of ``init_process_group`` or of
    ``new_group``)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == function and \
                frame.f_globals.get("__name__") == "torch.distributed.distributed_c10d":
            return frame.f_locals.get(variable)
        frame = frame.f_back
    return None


def _backend_asked():
    """The backend that the ``init_process_group`` calling this rendezvous was asked for
    (``None`` if it cannot be found): torch does not hand it to the handler, and another
    backend than ours would fail later, obscurely, on a store that is not there."""
    backend = c10d_local("init_process_group", "backend")
    return None if backend is None else str(backend).lower()


def env_rendezvous(url, timeout=None, **kwargs):
    """``env://`` as torch's, unless neither ``MASTER_ADDR`` nor ``MASTER_PORT`` is set:
    then rank and size from MPI and an :class:`MPIWorldStore` (see the module docstring)."""
    if any(os.environ.get(v) for v in TCP_VARIABLES):
        if timeout is not None:
            kwargs["timeout"] = timeout
        yield from _TORCH_ENV(url, **kwargs)
        return
    # As torch's handler: init_process_group's rank= and world_size= (in the query) win
    # over RANK and WORLD_SIZE.
    backend = _backend_asked()
    if backend not in (None, "hpctrain"):
        raise ValueError(
            f"init_process_group({backend!r}) without MASTER_ADDR and MASTER_PORT: only the "
            f"'hpctrain' backend meets its ranks through MPI. Set MASTER_ADDR and "
            f"MASTER_PORT for {backend} (torch's env:// rendezvous), use "
            f"hpctrain.torch.init_process_group(), which sets up a store for gloo through "
            f"MPI, or init_process_group('hpctrain')")
    given = {key: os.environ[variable] for key, variable in
             (("rank", "RANK"), ("world_size", "WORLD_SIZE")) if os.environ.get(variable)}
    given.update(parse_qsl(urlparse(url).query))
    rank, size = world_from_mpi(given)
    HANDED_OUT.append(MPIWorldStore())
    yield HANDED_OUT[-1], rank, size
    raise RuntimeError("hpctrain's MPI rendezvous cannot be repeated (a world has one size)")


# The module, not the function of that name that torch.distributed exports.
_HANDLERS = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
_TORCH_ENV = _HANDLERS["env"]


def install():
    """Put :func:`env_rendezvous` in front of torch's ``env://`` handler (once)."""
    _HANDLERS["env"] = env_rendezvous
