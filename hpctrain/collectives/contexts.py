"""The per-communicator context: a private duplicate and everything cached for it.

:func:`context` gives the :class:`Context` of a user communicator, made on first use and
stored on it as an MPI attribute, so that it is freed with it. It holds

- a private duplicate (``Dup()``) of the communicator, on which every message of ours
  moves, so that none can match a message of the user's, whatever tags either side uses;
- the :class:`~.plans.Plan` of each (algo, op, dtype, count, options), built by
  :mod:`.plans`, and the receive workspaces its plans use (reused, only grown);
- each algorithm's per-communicator set-up (its sub-communicators), made once, in the data
  phase of its first call, and released with the context;
- the mismatch check (:meth:`Context.verify`).
"""

from functools import partial

import numpy as np

from ..errors import UsageError
from .buffers import direct_bytes
from .check import CHECK_FIELDS, MismatchError, invalid_vector, mismatch_message
from .plans import NO_CALL, build
from .registry import ALGORITHMS

#: The MPI module, imported (and MPI initialised) when the first communicator is used, so
#: that importing this package, listing algorithms or checking arguments needs no MPI.
MPI = None


class Context:
    """A private duplicate of one user communicator and everything cached for it.

    Not thread-safe: like any MPI collective, one call at a time per communicator.
    """

    def __init__(self, comm):
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.plans = {}
        self.quick = {}        # (algo, op, NumPy or torch dtype, count) -> plan
        self.views = {}        # id(tensor) -> (tensor, data_ptr, dtype, numel, NumPy view)
        self.last_view = NO_VIEW
        self.last_call = NO_CALL   # the buffer reduced last, for the driver's fast path
        self.workspaces = {}
        self.fused = {}
        self.setups = {}       # (algo, params) -> the algorithm's per-communicator state
        self.check_recv = np.empty(2 * len(CHECK_FIELDS), dtype=np.int64)
        self._cuda_aware = None
        self._direct_bytes = None

    @property
    def cuda_aware(self):
        """Whether MPI takes CUDA device buffers here (asked once per communicator)."""
        if self._cuda_aware is None:
            from ..mpi.cuda import cuda_awareness

            self._cuda_aware = cuda_awareness(self.comm).aware is True
        return self._cuda_aware

    @property
    def direct_bytes(self):
        """The smallest CUDA message handed to MPI as device memory (read once per
        communicator; :func:`~.buffers.direct_bytes`)."""
        if self._direct_bytes is None:
            self._direct_bytes = direct_bytes()
        return self._direct_bytes

    def workspace(self, kind, count, make):
        """A reused array of at least ``count`` elements; ``make(count)`` allocates one.

        Growing it drops the cached plans, which hold views of the old one.
        """
        array = self.workspaces.get(kind)
        if array is None or array.shape[0] < count:
            array = make(count)
            self.workspaces[kind] = array
            self.forget_plans()
        return array

    def forget_plans(self):
        """Drop every cached plan (not the set-ups: those live as long as the context)."""
        self.plans.clear()
        self.quick.clear()
        self.last_call = NO_CALL

    def setup(self, algorithm, params):
        """The per-communicator state of ``algorithm`` with ``params``, made on first use.

        Synchronisation point on first use (:meth:`.Algorithm.setup` is collective).
        """
        key = (algorithm.name, algorithm.setup_key(params))
        if key not in self.setups:
            self.setups[key] = algorithm.setup(self.comm, params)
        return self.setups[key]

    def plan(self, key, algo, op, dtype, count, options, device):
        """The cached plan for ``key``, built (and all arguments validated) on first use."""
        plan = self.plans.get(key)
        if plan is None:
            plan = build(self, key, algo, op, dtype, count, options, device)
            if len(self.plans) > 512:
                self.forget_plans()
            self.plans[key] = plan
        return plan

    def scratch(self, dtype, count, device=None):
        """The reused receive workspace of ``dtype``'s transport elements, at least ``count``
        of them: in host memory, or on CUDA device ``device``."""
        if device is not None:
            return self.workspace(("cuda", device, dtype.transport), count,
                                  partial(_device_empty, dtype=dtype, device=device))
        return self.workspace(("host", dtype.transport), count,
                              partial(np.empty, dtype=dtype.transport))

    def bind_buffer(self, plan, flat):
        """``go()``: the data phase of ``plan`` on ``flat``, with ``flat`` bound."""
        if plan.count == 0 or self.size == 1 or plan.staged:
            return partial(plan.run, flat)
        return plan.algorithm.bind_buffer(self.comm, plan, flat, plan.run)

    def verify(self, vector, plan=None):
        """Raise :class:`MismatchError` on every rank unless every rank sent the same vector.

        One ``Allreduce(MAX)`` of ``[fields, -fields]`` (14 int64): about ``ceil(lg p)``
        latencies. Synchronisation point: every rank of the communicator must call it.
        """
        recv = self.check_recv
        self.comm.Allreduce(vector, recv, op=MPI.MAX)
        if recv.tobytes() != vector.tobytes():
            raise MismatchError(mismatch_message(recv, vector, plan))

    def announce_invalid(self):
        """Take part in the mismatch check for a call this rank found invalid, so that the
        other ranks raise too instead of waiting for this one."""
        try:
            self.verify(invalid_vector())
        except MismatchError:
            pass   # the caller raises this rank's own, more precise error

    def communicators(self):
        """The private duplicate and the communicators of the algorithms' set-ups: every
        communicator on which this context's messages move."""
        if self.comm is None:
            return []
        return [self.comm, *(comm for (name, _), state in self.setups.items()
                             for comm in ALGORITHMS[name].communicators(state))]

    def free(self):
        """Release the set-ups and the private communicator (when the user's communicator
        is freed)."""
        if AT_HAND.last[1] is self:
            AT_HAND.last = (None, None)
        self.views.clear()
        self.last_view = NO_VIEW
        self.forget_plans()
        self.workspaces.clear()
        self.fused.clear()
        alive = self.comm is not None and MPI is not None and not MPI.Is_finalized()
        setups, self.setups = self.setups, {}
        for (name, _), state in setups.items():
            if alive:
                ALGORITHMS[name].release(state)
        if alive:
            self.comm.Free()
        self.comm = None


#: ``Context.last_view`` when no tensor's view is at hand.
NO_VIEW = (None,)


def _device_empty(count, dtype, device):
    import torch

    return torch.empty(count, dtype=getattr(torch, dtype.transport), device=device)


_KEYVAL = None


class AtHand:
    """The contexts the driver finds without a lookup: ``world``, the Context of
    COMM_WORLD (the common case), and ``last``, the (communicator, Context) of the last
    explicit ``comm=`` argument. ``last`` is replaced whole, never changed in place: another
    thread may read it between the driver's two lookups."""

    def __init__(self):
        self.world = None
        self.last = (None, None)


#: The driver's shortcuts: :func:`context` sets them, :meth:`Context.free` clears ``last``.
AT_HAND = AtHand()


def context(comm=None):
    """The cached :class:`Context` of ``comm`` (``None``: ``COMM_WORLD``).

    The first call per communicator is collective (``Dup``); the context is stored as an
    attribute of ``comm`` and freed with it.
    """
    world = AT_HAND.world
    if comm is None and world is not None:
        return world
    _load_mpi()
    if comm is None or comm is MPI.COMM_WORLD:
        if AT_HAND.world is None:
            AT_HAND.world = Context(MPI.COMM_WORLD)
        if comm is not None:
            AT_HAND.last = (comm, AT_HAND.world)
        return AT_HAND.world
    if not isinstance(comm, MPI.Intracomm):
        raise UsageError(f"allreduce needs an mpi4py intracommunicator, got "
                         f"{type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise UsageError("allreduce got MPI.COMM_NULL: this process is not in the group")
    ctx = comm.Get_attr(_KEYVAL)
    if ctx is None:
        ctx = Context(comm)
        comm.Set_attr(_KEYVAL, ctx)
    AT_HAND.last = (comm, ctx)   # at hand for the next call; comm.Free() clears it (Context.free)
    return ctx


def existing(comm):
    """The :class:`Context` of ``comm`` if one was made, else ``None`` (local: an attribute
    lookup)."""
    if MPI is None:
        return None
    if comm is MPI.COMM_WORLD:
        return AT_HAND.world
    return comm.Get_attr(_KEYVAL)


def shape(comm=None):
    """``(size, rank)`` of ``comm`` (``None``: ``COMM_WORLD``), from local calls only: a
    call's arguments are checked with it before the first use of its context, which is
    collective (``Dup``)."""
    world = AT_HAND.world
    if comm is None and world is not None:
        return world.size, world.rank
    _load_mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        context(comm)   # raises the UsageError that says what is wrong with it
    return comm.Get_size(), comm.Get_rank()


def _load_mpi():
    global MPI, _KEYVAL
    if MPI is None:
        from mpi4py import MPI as mpi

        _KEYVAL = mpi.Comm.Create_keyval(delete_fn=lambda _comm, _key, ctx: ctx.free())
        MPI = mpi
