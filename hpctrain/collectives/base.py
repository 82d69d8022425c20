"""What every allreduce algorithm shares: the interface, buffers, dtypes, ops and caches.

An algorithm (one module each) is an :class:`Algorithm` registered by name in
``ALGORITHMS``. :func:`allreduce` does the work common to all of them, so that an algorithm
only says whom to send which slice to and when to reduce:

- it turns the user's NumPy array or torch tensor into a flat *transport* array, a view of
  the same memory (no copy); half precision travels as ``int16``, since MPI has no 16-bit
  float type, and is reduced through views in its real dtype;
- it runs everything on a private duplicate (``Dup()``) of the user's communicator, made
  once per communicator and cached on it as an MPI attribute, so that no message of ours
  can match a message of the user's, whatever tags either side uses;
- it caches, per communicator, a :class:`Plan` for each (algo, op, dtype, count, options):
  the algorithm's schedule (peers and slice bounds), the reduction function and a receive
  workspace that is reused and only grown when too small. The hot path builds nothing of the
  message's size;
- with ``check=True`` it first verifies, in one small allreduce, that every rank made the
  same call (see :meth:`Context.verify`).
"""

import sys
import zlib
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..errors import UsageError
from . import auto

#: The MPI module, imported (and MPI initialised) when the first communicator is used, so
#: that importing this package, listing algorithms or checking arguments needs no MPI.
MPI = None


class MismatchError(UsageError):
    """Ranks called the same collective with different arguments (count, dtype, op, ...).

    Raised on every rank of the communicator at once: no rank is left waiting.
    """


@dataclass(frozen=True)
class DType:
    """An element type allreduce accepts, and how it travels and is reduced."""

    name: str
    code: int                 # the number the mismatch check compares
    itemsize: int
    transport: str            # NumPy dtype the bytes travel as (MPI has no 16-bit float)
    integer: bool = False
    half: bool = False        # float16 and bfloat16: reduced with torch, in own precision

    @property
    def numpy(self):
        """The NumPy dtype of this type's values (``None`` for bfloat16: NumPy has none)."""
        return None if self.name == "bfloat16" else np.dtype(self.name)

    @property
    def torch(self):
        """The torch dtype of this type's values."""
        import torch

        return getattr(torch, self.name)


#: Supported element types by name.
DTYPES = {d.name: d for d in (
    DType("float16", 1, 2, "int16", half=True),
    DType("bfloat16", 2, 2, "int16", half=True),
    DType("float32", 3, 4, "float32"),
    DType("float64", 4, 8, "float64"),
    DType("int32", 5, 4, "int32", integer=True),
    DType("int64", 6, 8, "int64", integer=True),
)}

#: Reduction operations by name, with the number the mismatch check compares. ``avg`` is
#: ``sum`` followed by a division by the number of ranks (floor division for integers).
OPS = {"sum": 1, "avg": 2, "min": 3, "max": 4}

#: Algorithms by name; each module registers its own with :func:`register`.
ALGORITHMS = {}

_NUMPY_DTYPES = {np.dtype(d.name): d for d in DTYPES.values() if d.numpy is not None}
#: The NumPy dtypes that travel as they are (not half precision): the fast path's.
_PLAIN_DTYPES = {key: d for key, d in _NUMPY_DTYPES.items() if not d.half}


def register(algorithm_class):
    """Class decorator: add one instance of an :class:`Algorithm` to ``ALGORITHMS``."""
    algorithm = algorithm_class()
    ALGORITHMS[algorithm.name] = algorithm
    return algorithm_class


def choices(names):
    """``names`` as a sorted, comma-separated list, for error messages."""
    return ", ".join(sorted(names))


def chunk_bounds(count, parts):
    """Offsets of ``parts`` contiguous chunks covering ``count`` elements (``parts + 1`` of them).

    Chunk sizes differ by at most one element: the first ``count % parts`` chunks get the
    extra one.
    """
    size, extra = divmod(count, parts)
    return tuple(i * size + min(i, extra) for i in range(parts + 1))


def algorithm_code(name):
    """The number the mismatch check compares for an algorithm (the same on every rank)."""
    return zlib.crc32(name.encode())


class Algorithm:
    """One allreduce algorithm. Subclasses set ``name`` and ``options`` and define
    :meth:`schedule` and :meth:`run`; :func:`allreduce` does everything else.

    ``run(comm, flat, plan)`` reduces the 1-D transport array ``flat`` in place over the
    private communicator ``comm``. It finds its schedule in ``plan.schedule``, a receive
    workspace of ``plan.schedule.scratch`` elements in ``plan.scratch`` and the in-place
    reduction ``plan.reduce(dst, src)`` (``dst op= src``, both transport slices). It is
    called with the same schedule shape on every rank, so every send has a matching receive.
    """

    name = ""
    #: Options the algorithm takes (``allreduce(..., root=1)``), name -> default. Every value
    #: is an integer; ``None`` stands for a default that depends on the number of ranks.
    options = {}
    #: Tag of this algorithm's messages on the private communicator.
    tag = 0

    def parameters(self, size, options):
        """The validated option values as a tuple of ints, in the order of ``options``."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            valid = choices(self.options) if self.options else "none"
            raise UsageError(f"allreduce algorithm {self.name!r} takes no option "
                             f"{unknown[0]!r}; its options: {valid}")
        values = {**self.options, **options}
        for key, value in values.items():
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, (int, np.integer))):
                raise UsageError(f"allreduce option {key}={value!r} must be an integer")
        return self.validate(size, tuple(values[key] for key in self.options))

    def validate(self, size, params):
        """Check option values against the number of ranks; resolve ``None`` defaults."""
        return params

    def describe(self, params):
        """The options as ``key=value`` text, for error messages."""
        return ", ".join(f"{k}={v}" for k, v in zip(self.options, params)) or "no options"

    def schedule(self, size, rank, count, itemsize, params):
        """Who this rank exchanges which slices with, for ``count`` elements of ``itemsize``
        bytes; the result must have a ``scratch`` attribute (receive workspace elements).
        The default suits algorithms that hand the buffer to a library: no workspace."""
        return NO_SCHEDULE

    def run(self, comm, flat, plan):
        """Reduce ``flat`` in place over ``comm`` (see the class docstring)."""
        raise NotImplementedError

    def bind(self, comm, plan):
        """``run(flat)``, the data phase including ``plan.finish``, with ``comm`` and
        ``plan`` bound. Override to pre-bind more where per-call overhead matters."""
        run, finish = self.run, plan.finish
        if finish is None:
            return lambda flat: run(comm, flat, plan)

        def run_and_finish(flat):
            run(comm, flat, plan)
            finish(flat)
        return run_and_finish

    def bind_buffer(self, comm, plan, flat, run):
        """``go()``: ``run(flat)`` with this buffer bound, for a buffer reduced again and
        again (the next call on the same array skips every lookup). Override to pre-bind
        what depends on the buffer itself."""
        return partial(run, flat)

    def averages(self, dtype):
        """True if :meth:`run` computes ``op="avg"`` itself for ``dtype``."""
        return False

    def device_capable(self, dtype, cuda_aware):
        """True if :meth:`run` may be handed CUDA device memory for ``dtype``."""
        return cuda_aware is True


@dataclass(frozen=True)
class NoSchedule:
    """The schedule of an algorithm that needs none."""

    scratch: int = 0


NO_SCHEDULE = NoSchedule()


class RootedAlgorithm(Algorithm):
    """An algorithm with a ``root=`` option (default 0): a rank with a special role."""

    options = {"root": 0}

    def validate(self, size, params):
        root = params[0]
        if not 0 <= root < size:
            raise UsageError(f"allreduce option root={root} is not a rank: valid values are "
                             f"0 to {size - 1}")
        return (int(root),)


def mpi_datatype(dtype):
    """The MPI datatype of ``dtype``'s transport elements (MPI is loaded by then)."""
    return {"int16": MPI.INT16_T, "int32": MPI.INT32_T, "int64": MPI.INT64_T,
            "float32": MPI.FLOAT, "float64": MPI.DOUBLE}[dtype.transport]


def waitall(requests):
    """Wait for every request of the list to complete."""
    MPI.Request.Waitall(requests)


# ----- reductions ---------------------------------------------------------------------------

_UFUNCS = {"sum": np.add, "min": np.minimum, "max": np.maximum}


def host_reducer(dtype, op, count):
    """``reduce(dst, src)``: ``dst op= src`` on host transport arrays, in place.

    float16 and bfloat16 are reduced with torch in their own precision: every pairwise
    reduction is rounded once to the dtype (exactly what computing it in float32 and
    rounding back gives). NumPy's float16 arithmetic is ~30x slower than torch's and NumPy
    has no bfloat16.
    """
    if dtype.half:
        return _torch_reducer(dtype.torch, op, synchronize=None)
    ufunc = _UFUNCS[op]
    if count <= 2 and op == "sum" and not dtype.integer:
        # A ufunc call costs ~0.5 us (~1 us for one element) when the whole message takes
        # ~1 us; Python float adds are 3x cheaper and round the same (float64 exactly;
        # float32 once, from a float64 sum that is exact). Integers keep the ufunc, which
        # wraps on overflow where Python ints would not fit back.
        return add_few
    return lambda dst, src: ufunc(dst, src, out=dst)


def add_few(dst, src):
    """``dst += src`` for float arrays of at most 2 elements, with Python floats."""
    count = len(dst)
    if count:
        dst[0] = dst.item(0) + src.item(0)
        if count == 2:
            dst[1] = dst.item(1) + src.item(1)


def device_reducer(dtype, op, device):
    """``reduce(dst, src)`` on CUDA transport tensors; waits for the kernel before returning,
    because MPI reads the result straight from device memory in the next message."""
    import torch

    return _torch_reducer(dtype.torch, op,
                          synchronize=lambda: torch.cuda.current_stream(device).synchronize())


def _torch_reducer(torch_dtype, op, synchronize):
    import torch

    as_tensor = torch.from_numpy if synchronize is None else (lambda t: t)
    apply = {"sum": lambda d, s: d.add_(s), "min": lambda d, s: torch.minimum(d, s, out=d),
             "max": lambda d, s: torch.maximum(d, s, out=d)}[op]

    def reduce(dst, src):
        apply(as_tensor(dst).view(torch_dtype), as_tensor(src).view(torch_dtype))
        if synchronize is not None:
            synchronize()
    return reduce


def averager(dtype, size, on_device):
    """``finish(flat)``: divide the sum by ``size`` in place; floor division for integers
    (``-3 // 2 == -2``, as Python and ``np.floor_divide`` round)."""
    if on_device or dtype.half:
        torch_dtype = dtype.torch
        import torch

        as_tensor = (lambda t: t) if on_device else torch.from_numpy
        mode = "floor" if dtype.integer else None
        return lambda flat: as_tensor(flat).view(torch_dtype).div_(size, rounding_mode=mode)
    if dtype.integer:
        return lambda flat: np.floor_divide(flat, size, out=flat)
    return lambda flat: np.divide(flat, size, out=flat)


# ----- the communicator cache ---------------------------------------------------------------

#: Fields of the mismatch check, in the order of its vector.
CHECK_FIELDS = ("valid", "count", "dtype", "op", "algo", "options", "layout")
_LOW = np.iinfo(np.int64).min  # a contribution that changes neither the MAX nor the MIN


@dataclass
class Plan:
    """Everything a call with one (algo, op, dtype, count, options) needs, built once."""

    algorithm: Algorithm
    dtype: DType
    op: str
    count: int
    params: tuple
    schedule: object
    reduce: object
    scratch: object
    finish: object            # the average's division, or None
    check: np.ndarray         # this call's mismatch-check vector
    staged: bool = False      # CUDA data reduced through a pinned host buffer
    run: object = None        # run(flat): the whole data phase (see Context._bind)


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
        self.last_view = _NO_VIEW
        # (buf, algo, op, data_ptr or None, plan, go, dtype, and for a tensor its
        # data_ptr, is_contiguous and numel methods)
        self.last_call = _NO_CALL
        self.workspaces = {}
        self.fused = {}
        self.check_recv = np.empty(2 * len(CHECK_FIELDS), dtype=np.int64)
        self._cuda_aware = None

    @property
    def cuda_aware(self):
        """Whether MPI takes CUDA device buffers here (asked once per communicator)."""
        if self._cuda_aware is None:
            from ..mpi_support import cuda_awareness

            self._cuda_aware = cuda_awareness(self.comm).aware is True
        return self._cuda_aware

    def workspace(self, kind, count, make):
        """A reused array of at least ``count`` elements; ``make(count)`` allocates one.

        Growing it drops the cached plans, which hold views of the old one.
        """
        array = self.workspaces.get(kind)
        if array is None or array.shape[0] < count:
            array = make(count)
            self.workspaces[kind] = array
            self.plans.clear()
            self.quick.clear()
            self.last_call = _NO_CALL
        return array

    def plan(self, key, algo, op, dtype, count, options, device):
        """The cached plan for ``key``, built (and all arguments validated) on first use."""
        plan = self.plans.get(key)
        if plan is None:
            plan = self._build(algo, op, dtype, count, options, device)
            if len(self.plans) > 512:
                self.plans.clear()
                self.quick.clear()
            self.plans[key] = plan
        return plan

    def _build(self, algo, op, dtype, count, options, device):
        algorithm = ALGORITHMS.get(algo)
        if algorithm is None:
            raise UsageError(f"unknown allreduce algorithm {algo!r}; valid choices: "
                             f"{choices(ALGORITHMS)}")
        if op not in OPS:
            raise UsageError(f"unknown allreduce op {op!r}; valid choices: {choices(OPS)}")
        params = algorithm.parameters(self.size, options)
        schedule = algorithm.schedule(self.size, self.rank, count, dtype.itemsize, params)
        staged = device is not None and not algorithm.device_capable(dtype, self.cuda_aware)
        on_device = device is not None and not staged
        finish = None
        if op == "avg" and not algorithm.averages(dtype):
            finish = averager(dtype, self.size, on_device)
        reduce_op = "sum" if op == "avg" else op
        if on_device:
            reduce = device_reducer(dtype, reduce_op, device)
            scratch = self.workspace(("cuda", device, dtype.transport), schedule.scratch,
                                     lambda n: _device_empty(n, dtype, device))
        else:
            reduce = host_reducer(dtype, reduce_op, count)
            scratch = self.workspace(("host", dtype.transport), schedule.scratch,
                                     lambda n: np.empty(n, dtype=dtype.transport))
        values = (1, count, dtype.code, OPS[op], algorithm_code(algo),
                  zlib.crc32(repr(params).encode()), 0)
        check = np.array(values + tuple(-v for v in values), dtype=np.int64)
        plan = Plan(algorithm, dtype, op, count, params, schedule, reduce, scratch, finish,
                    check, staged)
        plan.run = self._bind(plan, on_device)
        return plan

    def _bind(self, plan, on_device):
        """``run(flat)``: the data phase of ``plan``, with everything it needs bound."""
        if plan.count == 0 or self.size == 1:
            return _nothing
        if plan.staged:
            return lambda flat: _run_staged(self, plan, flat)
        run = plan.algorithm.bind(self.comm, plan)
        if on_device:
            torch = sys.modules["torch"]

            def run_on_device(flat, run=run):
                # MPI reads device memory directly: kernels that wrote it must be done.
                torch.cuda.current_stream(flat.device).synchronize()
                run(flat)
            return run_on_device
        return run

    def bind_buffer(self, plan, flat):
        """``go()``: the data phase of ``plan`` on ``flat``, with ``flat`` bound."""
        if plan.count == 0 or self.size == 1 or plan.staged:
            return partial(plan.run, flat)
        return plan.algorithm.bind_buffer(self.comm, plan, flat, plan.run)

    def verify(self, vector, plan=None):
        """Raise :class:`MismatchError` on every rank unless every rank sent the same vector.

        One ``Allreduce(MAX)`` of ``[fields, -fields]`` (14 int64) gives every rank the
        maximum and minimum of each field, so all ranks see the same disagreement and raise
        together: it costs one small allreduce, about ``ceil(lg p)`` latencies. A rank whose
        own arguments were invalid sends ``valid = 0`` and neutral values for the rest.
        Synchronisation point: every rank of the communicator must call it.
        """
        recv = self.check_recv
        self.comm.Allreduce(vector, recv, op=MPI.MAX)
        if recv.tobytes() != vector.tobytes():
            raise MismatchError(_mismatch_message(recv, vector, plan))

    def announce_invalid(self):
        """Take part in the mismatch check for a call this rank found invalid, so that the
        other ranks raise too instead of waiting for this one."""
        vector = np.full(2 * len(CHECK_FIELDS), _LOW, dtype=np.int64)
        vector[0] = vector[len(CHECK_FIELDS)] = 0
        try:
            self.verify(vector)
        except MismatchError:
            pass   # the caller raises this rank's own, more precise error

    def free(self):
        """Release the private communicator (when the user's communicator is freed)."""
        global _LAST
        if _LAST[1] is self:
            _LAST = (None, None)
        self.views.clear()
        self.last_view = _NO_VIEW
        self.last_call = _NO_CALL
        self.plans.clear()
        self.quick.clear()
        self.workspaces.clear()
        self.fused.clear()
        if self.comm is not None and MPI is not None and not MPI.Is_finalized():
            self.comm.Free()
        self.comm = None


def _device_empty(count, dtype, device):
    import torch

    return torch.empty(count, dtype=getattr(torch, dtype.transport), device=device)


def _mismatch_message(recv, mine, plan):
    k = len(CHECK_FIELDS)
    high, low = recv[:k], -recv[k:]
    names = {"dtype": {d.code: d.name for d in DTYPES.values()},
             "op": {code: name for name, code in OPS.items()},
             "algo": {algorithm_code(name): name for name in ALGORITHMS}}
    problems = []
    for i, field in enumerate(CHECK_FIELDS):
        if high[i] == low[i]:
            continue
        if field == "valid":
            problems.append("some ranks rejected their arguments (their error says why)")
        elif field in ("options", "layout"):
            what = "the algorithm's options" if field == "options" else "the fused tensors' sizes"
            own = f" (this rank: {plan.algorithm.describe(plan.params)})" \
                if field == "options" and plan is not None else ""
            problems.append(f"{what} differ{own}")
        else:
            label = names.get(field, {})
            lo, hi, me = (label.get(int(v), int(v)) for v in (low[i], high[i], mine[i]))
            problems.append(f"{field} differs: from {lo} to {hi} (this rank: {me})")
    return ("allreduce called with different arguments on different ranks: "
            + "; ".join(problems)
            + ". Every rank must pass the same count, dtype, op, algo and options.")


_KEYVAL = None
_WORLD = None          # the Context of COMM_WORLD, the common case, kept at hand
# (communicator, Context) of the last explicit comm= argument. Replaced whole, never
# changed in place: another thread may read it between our two lookups.
_LAST = (None, None)


def context(comm=None):
    """The cached :class:`Context` of ``comm`` (``None``: ``COMM_WORLD``).

    The first call per communicator is collective (``Dup``); the context is stored as an
    attribute of ``comm`` and freed with it.
    """
    global _WORLD, _LAST
    if comm is None and _WORLD is not None:
        return _WORLD
    _load_mpi()
    if comm is None or comm is MPI.COMM_WORLD:
        if _WORLD is None:
            _WORLD = Context(MPI.COMM_WORLD)
        if comm is not None:
            _LAST = (comm, _WORLD)
        return _WORLD
    if not isinstance(comm, MPI.Intracomm):
        raise UsageError(f"allreduce needs an mpi4py intracommunicator, got "
                         f"{type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise UsageError("allreduce got MPI.COMM_NULL: this process is not in the group")
    ctx = comm.Get_attr(_KEYVAL)
    if ctx is None:
        ctx = Context(comm)
        comm.Set_attr(_KEYVAL, ctx)
    _LAST = (comm, ctx)   # at hand for the next call; comm.Free() clears it (Context.free)
    return ctx


def _load_mpi():
    global MPI, _KEYVAL
    if MPI is None:
        from mpi4py import MPI as mpi

        _KEYVAL = mpi.Comm.Create_keyval(delete_fn=lambda _comm, _key, ctx: ctx.free())
        MPI = mpi


# ----- buffers ------------------------------------------------------------------------------

def flatten(buf):
    """``(flat, dtype, device)``: a 1-D transport view of ``buf`` (no copy), its
    :class:`DType`, and ``None`` for host memory or the CUDA device index."""
    if isinstance(buf, np.ndarray):
        dtype = _NUMPY_DTYPES.get(buf.dtype)
        if dtype is None:
            raise _bad_dtype(buf.dtype.str if buf.dtype.byteorder == ">" else buf.dtype.name)
        if not buf.flags.c_contiguous:
            raise UsageError(f"allreduce needs a contiguous buffer, got a non-contiguous "
                             f"array of shape {buf.shape} and strides {buf.strides}: pass "
                             f"np.ascontiguousarray(buf) and use the array it returns (the "
                             f"reduction is in place)")
        if not buf.flags.writeable:
            raise UsageError("allreduce reduces in place, but the array is read-only")
        flat = buf.reshape(-1)
        return (flat.view(np.int16) if dtype.half else flat), dtype, None
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(buf, torch.Tensor):
        raise UsageError(f"allreduce needs a NumPy array or a torch tensor, got "
                         f"{type(buf).__name__}")
    return _flatten_tensor(buf, torch)


class _NoTensor:
    pass


_TENSOR = [_NoTensor]   # [torch.Tensor] once a tensor has been seen (torch is imported)


def _flatten_tensor(buf, torch):
    _TENSOR[0] = torch.Tensor
    dtype = DTYPES.get(str(buf.dtype).replace("torch.", ""))
    if dtype is None:
        raise _bad_dtype(str(buf.dtype))
    if not buf.is_contiguous():
        raise UsageError(f"allreduce needs a contiguous tensor, got one of shape "
                         f"{tuple(buf.shape)} and strides {buf.stride()}: pass "
                         f"buf.contiguous() and use the tensor it returns (the reduction is "
                         f"in place)")
    flat = buf.detach().view(-1)
    if dtype.half:
        flat = flat.view(torch.int16)
    if buf.device.type == "cuda":
        return flat, dtype, buf.device.index
    if buf.device.type != "cpu":
        raise UsageError(f"allreduce supports CPU and CUDA tensors, got one on {buf.device}")
    return flat.numpy(), dtype, None


def _bad_dtype(name):
    return UsageError(f"allreduce does not support dtype {name}; valid choices: "
                      f"{choices(DTYPES)}")


def pinned(ctx, dtype, count):
    """A reused page-locked host buffer of ``count`` transport elements (torch tensor),
    through which CUDA data is staged when MPI is not CUDA-aware."""
    import torch

    def make(n):
        return torch.empty(n, dtype=getattr(torch, dtype.transport), pin_memory=True)
    return ctx.workspace(("pinned", dtype.transport), count, make)[:count]


# ----- the driver ---------------------------------------------------------------------------

def allreduce(buf, op="sum", algo="ring", comm=None, check=True, **options):
    """Reduce ``buf`` over every rank of ``comm`` in place and return it.

    ``buf``: a contiguous NumPy array or torch tensor of any shape (its flattened elements
    are reduced), dtype float16, bfloat16 (torch only), float32, float64, int32 or int64, in
    host memory or on a CUDA device. ``op``: ``sum``, ``avg``, ``min`` or ``max``; ``avg`` is
    the sum divided by the number of ranks, with floor division for integer dtypes.
    ``algo``: a name in ``ALGORITHMS``, or ``auto`` (chosen per size from the profile given
    to :func:`hpctrain.collectives.auto.use`); ``options``: that algorithm's options (``root=``,
    ``servers=``, ``switch_bytes=``). ``comm``: an mpi4py intracommunicator, default
    ``COMM_WORLD``; the data moves on a private duplicate of it, so pending user messages
    are never matched.

    Half precision (float16, bfloat16) is reduced in its own precision: each pairwise
    reduction is computed by torch and rounded once to the dtype, as computing it in float32
    and rounding back would; the error can grow with every one of the ``p - 1`` additions
    that make up each element's sum.

    Synchronisation point: a collective. Every rank of ``comm`` must call it, in the same
    order as its other collectives on ``comm``, with the same element count, dtype, op,
    algo, options and ``check``. With ``check=True`` (the default) a call that breaks this is
    detected before any data moves, by one extra small allreduce (about ``ceil(lg p)``
    latencies), and raises :class:`MismatchError` on every rank; an argument that is wrong
    on only some ranks raises its own ``UsageError`` there and a ``MismatchError`` on the
    others (``comm`` excepted: it must be valid everywhere). With ``check=False`` that
    allreduce is saved, and a mismatched call may hang or return garbage. An error in the data phase itself (an MPI failure) is not coordinated:
    run under :func:`hpctrain.runtime.run_guarded` so that it ends the job.

    CUDA tensors: a CUDA-aware MPI gets device memory straight after the current stream
    has been synchronised, and the reductions run on the device with torch; otherwise the
    data is staged through a reused page-locked host buffer.
    """
    if algo == "auto":
        algo = auto.NAME[0]     # "auto#<generation of the profile in use>"
    if comm is None:
        ctx = _WORLD or context()
    else:
        last = _LAST
        ctx = last[1] if comm is last[0] else context(comm)
    # The same buffer as the last call, reduced the same way (a timed loop, a small message
    # sent every step): its plan and its bound data phase are at hand once the buffer is
    # checked to still be the memory, dtype and layout it was.
    last = ctx.last_call
    if buf is last[0] and algo == last[1] and op == last[2] and not options and (
            (last[7]() == last[3] and buf.dtype is last[6] and last[8]()
             and last[9]() == last[4].count) if last[3] is not None else
            (buf.dtype is last[6] and buf.flags.c_contiguous and buf.flags.writeable)):
        if check and ctx.size > 1:
            ctx.verify(last[4].check, last[4])
        last[5]()
        return buf
    try:
        # The common cases first, since this is the per-call cost of small messages: an
        # array or tensor seen before, whose plan exists (its dtype was checked then).
        plan = None
        if options:
            pass
        elif type(buf) is np.ndarray:
            flags = buf.flags
            if flags.c_contiguous and flags.writeable:
                plan = ctx.quick.get((algo, op, buf.dtype, buf.size))
                flat = buf if buf.ndim == 1 else buf.reshape(-1)
        elif type(buf) is _TENSOR[0]:
            # Tensor.numpy() costs ~1.5 us: reuse the view made last time, if the tensor
            # still has the same memory, dtype, size and layout.
            view = ctx.last_view
            if view[0] is not buf:
                view = ctx.views.get(id(buf))
            if view is not None and view[0] is buf and buf.data_ptr() == view[1] \
                    and buf.dtype is view[2] and buf.numel() == view[3] and buf.is_contiguous():
                flat = view[4]
                plan = ctx.quick.get((algo, op, view[2], view[3]))
                ctx.last_view = view
        if plan is None:
            flat, plan = resolve(ctx, buf, op, algo, options)
    except UsageError:
        if check and ctx.size > 1:
            ctx.announce_invalid()
        raise
    if check and ctx.size > 1:
        ctx.verify(plan.check, plan)
    plan.run(flat)
    if type(flat) is np.ndarray and not options and algo[:5] != "auto#":
        # A host buffer (a CUDA tensor's run synchronises its stream: not worth it there).
        # The tensor's memory is checked by address; an array is kept alive (and so cannot
        # be resized in place) by this reference.
        # The tensor's bound methods are kept too: looking them up costs more than a call.
        probes = (None,) * 3 if type(buf) is np.ndarray else \
            (buf.data_ptr, buf.is_contiguous, buf.numel)
        ptr = None if probes[0] is None else buf.data_ptr()
        ctx.last_call = (buf, algo, op, ptr, plan, ctx.bind_buffer(plan, flat), buf.dtype,
                         *probes)
    return buf


def resolve(ctx, buf, op, algo, options):
    """``(flat, plan)`` for a call: the transport view of ``buf`` and its (cached) plan."""
    flat, dtype, device = flatten(buf)
    count = len(flat)
    key = (algo, op, dtype.code, count, device, options_key(options) if options else ())
    if algo[:5] == "auto#":
        # The profile's choice for this size, cached under the profile's own name
        # (auto.current_name), so that a new profile takes effect at the next call.
        chosen = auto.choice(count * dtype.itemsize, ctx.size)[0]
        plan = ctx.plans.get(key) or ctx.plan(key, chosen, op, dtype, count, options, device)
    else:
        plan = ctx.plans.get(key) or ctx.plan(key, algo, op, dtype, count, options, device)
    if options or device is not None:
        return flat, plan
    if type(buf) is np.ndarray and not dtype.half:
        ctx.quick[(algo, op, buf.dtype, count)] = plan
    elif type(buf) is _TENSOR[0]:
        ctx.quick[(algo, op, buf.dtype, count)] = plan
        if count * dtype.itemsize <= VIEW_BYTES:
            # The cache holds the tensor (the view needs its memory): small ones only.
            if len(ctx.views) >= VIEW_TENSORS:
                ctx.views.clear()
                ctx.last_view = _NO_VIEW
            ctx.views[id(buf)] = (buf, buf.data_ptr(), buf.dtype, count, flat)
    return flat, plan


#: Tensors whose NumPy views are kept for the next call: at most this many, this small.
VIEW_TENSORS, VIEW_BYTES = 16, 256 * 1024
_NO_VIEW = (None,)
_NO_CALL = (None,) * 10


def options_key(options):
    """The options as a hashable cache key; a ``UsageError`` for an unhashable value."""
    key = tuple(options.items())
    try:
        hash(key)
    except TypeError:
        raise UsageError(f"allreduce options must be integers, got {options}") from None
    return key


def _nothing(flat):
    pass


def _run_staged(ctx, plan, flat):
    host = pinned(ctx, plan.dtype, plan.count)
    host.copy_(flat)       # device -> page-locked host; blocks until the copy is done
    plan.algorithm.bind(ctx.comm, plan)(host.numpy())
    flat.copy_(host)


def allreduce_fused(tensors, op="avg", algo="ring", comm=None, check=True, **options):
    """Reduce every array or tensor of ``tensors`` in place with one allreduce; return the list.

    The inputs (same dtype, all NumPy or all torch on one device, any shapes and strides)
    are copied into one flat buffer, reduced in one call of :func:`allreduce` and copied
    back. The buffer is kept per (communicator, dtype, device) and only grown, so a training
    loop that fuses the same gradients each step allocates once.

    Synchronisation point, as :func:`allreduce`; every rank must pass tensors of the same
    sizes in the same order (sort named parameters first). With ``check=True`` the sizes
    are part of the mismatch check.
    """
    tensors = list(tensors)
    if algo == "auto":
        algo = auto.NAME[0]
    ctx = context(comm)
    try:
        buffer, sizes = _fused_buffer(ctx, tensors)
        flat, plan = resolve(ctx, buffer, op, algo, options) if tensors else (None, None)
    except UsageError:
        if check and ctx.size > 1:
            ctx.announce_invalid()
        raise
    if check and ctx.size > 1:
        vector = _empty_vector() if plan is None else plan.check.copy()
        k = len(CHECK_FIELDS)
        vector[k - 1] = zlib.crc32(repr(sizes).encode())
        vector[2 * k - 1] = -vector[k - 1]
        ctx.verify(vector, plan)
    if plan is None:
        return tensors
    segments = []
    offset = 0
    for size in sizes:
        segments.append(buffer[offset:offset + size])
        offset += size
    for tensor, segment in zip(tensors, segments):
        _copy_in(segment, tensor)
    plan.run(flat)
    for tensor, segment in zip(tensors, segments):
        _copy_out(tensor, segment)
    return tensors


def _empty_vector():
    k = len(CHECK_FIELDS)
    vector = np.zeros(2 * k, dtype=np.int64)
    vector[0], vector[k] = 1, -1
    return vector


def _fused_buffer(ctx, tensors):
    """The reused flat buffer for ``tensors`` (a view of its first elements), and their sizes."""
    if not tensors:
        return np.empty(0, dtype=np.float32), ()
    kinds = sorted({f"{type(t).__module__}.{type(t).__name__} {t.dtype} "
                    f"{getattr(t, 'device', 'cpu')}" for t in tensors})
    if len(kinds) > 1:
        raise UsageError(f"allreduce_fused needs tensors of one dtype, all NumPy or all torch "
                         f"on one device; got: {'; '.join(kinds)}")
    first = tensors[0]
    sizes = tuple(int(np.prod(t.shape)) for t in tensors)
    total = sum(sizes)
    if isinstance(first, np.ndarray):
        kind = ("fused", first.dtype.str)

        def make(n):
            return np.empty(n, dtype=first.dtype)
    else:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(first, torch.Tensor):
            raise UsageError(f"allreduce_fused needs NumPy arrays or torch tensors, got "
                             f"{type(first).__name__}")
        kind = ("fused", str(first.dtype), str(first.device))

        def make(n):
            return torch.empty(n, dtype=first.dtype, device=first.device)
    buffer = ctx.fused.get(kind)
    if buffer is None or buffer.shape[0] < total:
        buffer = ctx.fused[kind] = make(total)
    return buffer[:total], sizes


def _copy_in(segment, tensor):
    if isinstance(segment, np.ndarray):
        np.copyto(segment.reshape(tensor.shape), tensor)
    else:
        segment.view(tensor.shape).copy_(tensor.detach())


def _copy_out(tensor, segment):
    if isinstance(segment, np.ndarray):
        np.copyto(tensor, segment.reshape(tensor.shape))
    else:
        tensor.detach().copy_(segment.view(tensor.shape))
