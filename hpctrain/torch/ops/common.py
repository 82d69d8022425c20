"""What every operation of ``hpctrain.torch`` shares: the ops, argument checks, names, and
the hand-over to the communication thread (:mod:`hpctrain.torch.engine`).

A call checks its arguments here, on the caller's thread. A bad argument is raised here
*and* announced to the other ranks under the same name (an invalid request), so that they
fail with this rank's reason instead of waiting for a request that will never come.
"""

import math
from typing import NamedTuple

import torch

from ..basics import world
from ..engine import INVALID, HorovodInternalError, Request, Signature
from ..process_sets import ProcessSet, global_process_set

# Horovod's numbering of the reduction operations.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
#: The collectives' names of the ops (Adasum has a module of its own).
OP_NAMES = {Average: "avg", Sum: "sum", Min: "min", Max: "max", Product: "prod"}

#: dtypes the reductions take as they are; the small integer types travel widened.
REDUCED = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
           torch.int64}
WIDENED = {torch.uint8: torch.int32, torch.int8: torch.int32, torch.int16: torch.int32,
           torch.bool: torch.int32}


def unsupported(what, instead):
    """A ``NotImplementedError`` for a Horovod feature hpctrain does not offer."""
    return NotImplementedError(f"hpctrain.torch does not support {what}; {instead}")


def resolve_op(average, op, adasum=True):
    """The reduction op from Horovod's ``average``/``op`` pair (``Average`` by default)."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum and adasum:
        return op
    if op not in OP_NAMES:
        raise ValueError(f"unknown reduction op {op!r}: use hvd.Average, hvd.Sum, hvd.Min, "
                         f"hvd.Max, hvd.Product" + (" or hvd.Adasum" if adasum else ""))
    return op


def check_tensor(tensor, function, reduced=True):
    """``TypeError``/``ValueError`` unless ``tensor`` is a dense CPU or CUDA torch tensor of a
    dtype the operation takes (``reduced=False``: any dtype, the data only moves)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"hpctrain.torch.{function} takes a torch.Tensor, got "
                        f"{type(tensor).__name__}")
    if tensor.is_sparse:
        raise unsupported(f"sparse tensors in {function}",
                          "use sparse_allreduce_async, or pass tensor.to_dense()")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"hpctrain.torch.{function}: tensors on {tensor.device.type!r} are "
                         f"not supported; move it to the CPU or a CUDA device")
    if reduced and tensor.dtype not in REDUCED and tensor.dtype not in WIDENED:
        raise TypeError(f"hpctrain.torch.{function}: dtype {tensor.dtype} cannot be reduced; "
                        f"use a float, integer or bool tensor")


def dtype_name(tensor):
    """``"float32"`` for ``torch.float32``: what signatures and messages show."""
    return str(tensor.dtype).replace("torch.", "")


def where(tensor):
    """The device kind, part of every signature: a CPU tensor never pairs with a CUDA one."""
    return tensor.device.type


def member_set(w, process_set, function):
    """The registered :class:`ProcessSet` to run on; ``ValueError`` (on this rank only: the
    set's members do not wait for it) if it is not registered or this rank is outside it."""
    pset = global_process_set if process_set is None else process_set
    if not isinstance(pset, ProcessSet):
        raise TypeError(f"hpctrain.torch.{function}: process_set must be an hvd.ProcessSet "
                        f"(hvd.global_process_set or one from hvd.add_process_set), got "
                        f"{type(pset).__name__}")
    if pset.lost is not None:
        raise ValueError(f"hpctrain.torch.{function}: {pset.lost}")
    if pset.process_set_id is None or pset.process_set_id not in w.sets:
        raise ValueError(f"hpctrain.torch.{function}: {pset} is not registered: add it with "
                         f"hvd.add_process_set(...) (on every rank) or init(process_sets=...)")
    if w.rank not in pset.ranks:
        raise ValueError(f"hpctrain.torch.{function}: rank {w.rank} is not in {pset}; only "
                         f"its ranks {pset.ranks} may run collectives on it")
    return pset


class Call(NamedTuple):
    """One call of an operation, started: the world, its process set, its name and what its
    ``check`` gave back."""

    world: object
    process_set: object
    name: str
    checked: object


def start(function, name, process_set, check):
    """The :class:`Call` of one operation, after ``check(process_set)`` has passed here; what
    it returns (an op, a root, the splits) is the call's ``checked``.

    An unnamed call gets the next number of its process set (``noname.N``), the same on
    every rank that makes its calls in the same order, whatever their kinds: two ranks
    whose N-th unnamed calls differ fail together instead of waiting for each other. If
    ``check()`` raises, the other ranks of the set are told under that name, and the error
    is raised here.
    """
    w = world()
    pset = member_set(w, process_set, function)
    if name is None:
        name = w.next_name(pset.process_set_id)
    else:
        # As in Horovod, a name is the operation's kind and the user's name: an allreduce
        # and a broadcast may both be called "w" at the same time.
        name = f"{kind_of(function)}.{name}"
    try:
        checked = check(pset)
    except (TypeError, ValueError, NotImplementedError, RuntimeError) as error:
        announce_invalid(w, pset, name, f"{function}: {error}")
        raise
    return Call(w, pset, name, checked)


def kind_of(function):
    """``"allreduce"`` for ``allreduce_async_``, ``grouped_allreduce`` and the like."""
    kind = function.split(" ")[0].removeprefix("grouped_").removesuffix("_")
    return kind.removesuffix("_async")


def announce_invalid(w, pset, name, reason):
    """Tell the set's other ranks that this rank's call ``name`` is invalid (they raise)."""
    try:
        w.engine.submit(Request(pset.process_set_id, name, INVALID, f"invalid: {reason}",
                                None))
    except (ValueError, HorovodInternalError):
        pass        # the name is in flight here already, or the engine has ended


def submit(w, pset, name, signature, describe, run, info=None, repeats=False, timeout=None):
    """Queue one operation (see :class:`hpctrain.torch.engine.Request`); return its handle."""
    return w.engine.submit(Request(pset.process_set_id, name, signature, describe, run, info,
                                   repeats, timeout))


def rows_moved(comm, tensor, rows, move):
    """On the communication thread: a new tensor of ``sum(rows)`` rows shaped as ``tensor``'s
    other dimensions, filled by ``move(send, recv, width)`` (flat views of ``tensor`` and of
    the result; ``width``: elements per row): an allgather's or an alltoall's data phase.
    Over one rank, a copy of ``tensor``."""
    rest = tuple(tensor.shape[1:])
    out = torch.empty((sum(rows),) + rest, dtype=tensor.dtype, device=tensor.device)
    if comm.Get_size() == 1:
        out.copy_(tensor)
    else:
        move(tensor.detach().contiguous().view(-1), out.view(-1), math.prod(rest))
    return out


def describe_tensors(kind, name, tensors, **extra):
    """What a call passed, for the mismatch message."""
    what = ", ".join(f"{tuple(t.shape)} {dtype_name(t)} {where(t)}" for t in tensors)
    more = "".join(f" {k}={v}" for k, v in extra.items())
    return f"{kind}(name={name!r}: {what}{more})"


# ----- CUDA stream ordering -----------------------------------------------------------------

def caller_event(tensors):
    """A CUDA event after the caller's pending work on ``tensors`` (``None`` on the CPU)."""
    for t in tensors:
        if t.is_cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(t.device))
            return event
    return None


def wait_event(event, tensors):
    """Make this thread's current stream wait for ``event`` (recorded by another thread)."""
    if event is not None:
        torch.cuda.current_stream(tensors[0].device).wait_event(event)


def on_thread(tensors, work):
    """``run(comm, infos)`` for the engine: ``work(comm, infos)`` after the caller's pending
    CUDA work on ``tensors``, returning ``(result, event)``."""
    event = caller_event(tensors)

    def run(comm, infos):
        wait_event(event, tensors)
        result = work(comm, infos)
        return result, caller_event(tensors)
    return run


def synchronize(handle):
    """Wait for the operation of ``handle``; return its result (the output tensor)."""
    result, event = handle.wait()
    if event is not None:
        torch.cuda.current_stream().wait_event(event)
    return result


def poll(handle):
    """True when the operation of ``handle`` has finished (``synchronize`` will not block)."""
    return handle.done.is_set()


def scaled(tensor, factor):
    """``tensor`` times ``factor`` in place, as Horovod scales: integers in float64, then
    rounded back to the tensor's dtype; half precision in float32 on the CPU, and on a CUDA
    device by the factor rounded to the tensor's dtype (Horovod's GPU kernels multiply two
    halves; their exact product, rounded once, is what this gives)."""
    if factor == 1.0:
        return tensor
    if tensor.dtype.is_floating_point and tensor.itemsize >= 4:
        return tensor.mul_(factor)
    if tensor.dtype.is_floating_point and tensor.is_cuda:
        return tensor.mul_(torch.tensor(factor, dtype=tensor.dtype).item())
    wide = torch.float32 if tensor.dtype.is_floating_point else torch.float64
    tensor.copy_(tensor.to(wide).mul_(factor))
    return tensor


def signature(kind, tensors=(), op=None, prescale=1.0, postscale=1.0, extra=(),
              ragged=False, dtypes=None):
    """The :class:`~hpctrain.torch.engine.Signature` of one operation over ``tensors``: what
    every rank must agree on (the mismatch check). The one builder of every signature.

    ``ragged``: the tensors' first dimension may differ by rank (an allgather's, an
    alltoall's rows) and is left out of their shapes; ``dtypes``: the names of the dtypes
    they travel in where those are not theirs (a compressed bucket's); ``extra``: whatever
    else the ranks must agree on (a root, a bucket's parameter names)."""
    first = 1 if ragged else 0
    return Signature(kind, tuple(tuple(t.shape)[first:] for t in tensors),
                     tuple(dtype_name(t) for t in tensors) if dtypes is None else tuple(dtypes),
                     tuple(where(t) for t in tensors), op, float(prescale), float(postscale),
                     tuple(extra))


def object_call(kind, name, process_set, call, extra=(), check=lambda pset: None):
    """Run ``call(comm)`` (a pickled mpi4py collective) as one operation of the set, once
    ``check(process_set)`` has passed (see :func:`start`)."""
    w, pset, name, _ = start(kind, name, process_set, check)
    return synchronize(submit(w, pset, name, signature(kind, extra=extra),
                              f"{kind}(name={name!r})", lambda comm, infos: (call(comm), None)))
