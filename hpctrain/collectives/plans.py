"""A call's plan: everything one (algo, op, dtype, count, options) needs, built once per
communicator context (:mod:`.contexts`) and reused by every later call like it.

:func:`build` validates a call and plans it: the options, the reduction kernels, the
mismatch check's vector and, once the schedule is made (:func:`complete`), the workspace and
the bound data phase. The hot path builds nothing of the message's size. A
:class:`LastCall` keeps the call a context made last on a host buffer, for the driver's
fast path.
"""

import sys
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..errors import UsageError
from .algorithm import Algorithm
from .buffers import on_device as device_path, run_staged
from .check import call_vector
from .dtypes import DType, OPS, choices
from .kernels import averager, device_reducer, host_reducer
from .registry import ALGORITHMS


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
    run: object = None        # run(flat): the whole data phase (see bind)
    setup: object = None      # the algorithm's per-communicator state (Algorithm.setup)


def build(ctx, key, algo, op, dtype, count, options, device):
    """Validate a call on the context ``ctx`` and plan it. No message is sent here, so that
    a rank whose arguments are wrong can still take part in the mismatch check."""
    algorithm = ALGORITHMS.get(algo)
    if algorithm is None:
        raise UsageError(f"unknown allreduce algorithm {algo!r}; valid choices: "
                         f"{choices(ALGORITHMS)}")
    if op not in OPS:
        raise UsageError(f"unknown allreduce op {op!r}; valid choices: {choices(OPS)}")
    params = algorithm.parameters(ctx.size, options)
    staged = device is not None and not device_path(ctx, algorithm, dtype,
                                                    count * dtype.itemsize)
    on_device = device is not None and not staged
    finish = None
    if op == "avg" and not algorithm.averages(dtype):
        finish = averager(dtype, ctx.size, on_device)
    reduce_op = "sum" if op == "avg" else op
    reduce = device_reducer(dtype, reduce_op, device) if on_device \
        else host_reducer(dtype, reduce_op, count)
    plan = Plan(algorithm, dtype, op, count, params, None, reduce, None, finish,
                call_vector(algo, op, dtype, count, params), staged)
    if count == 0 or ctx.size == 1:
        plan.run = _nothing
    elif algorithm.has_setup:
        # The set-up is collective: it waits for the data phase, after the mismatch
        # check has shown that every rank is making this same call.
        plan.run = partial(_first_run, ctx, key, plan, device, on_device)
    else:
        complete(ctx, plan, device, on_device)
    return plan


def _first_run(ctx, key, plan, device, on_device, flat):
    complete(ctx, plan, device, on_device)
    # A workspace grown just now dropped every cached plan, this one too, though it
    # holds the new workspace: keep it, or the next call would plan again.
    ctx.plans[key] = plan
    plan.run(flat)


def complete(ctx, plan, device, on_device):
    """Give ``plan`` its set-up, schedule, workspace and bound data phase."""
    algorithm, dtype = plan.algorithm, plan.dtype
    if algorithm.has_setup:
        plan.setup = ctx.setup(algorithm, plan.params)
    plan.schedule = schedule = algorithm.schedule(ctx.size, ctx.rank, plan.count,
                                                  dtype.itemsize, plan.params, plan.setup)
    plan.scratch = ctx.scratch(dtype, schedule.scratch, device if on_device else None)
    plan.run = bind(ctx, plan, on_device)


def bind(ctx, plan, on_device):
    """``run(flat)``: the data phase of ``plan``, with everything it needs bound."""
    if plan.staged:
        return partial(run_staged, ctx, plan)
    run = plan.algorithm.bind(ctx.comm, plan)
    if on_device:
        torch = sys.modules["torch"]

        def run_on_device(flat, run=run):
            # MPI reads device memory directly: kernels that wrote it must be done.
            torch.cuda.current_stream(flat.device).synchronize()
            run(flat)
        return run_on_device
    return run


def _nothing(flat):
    pass


class LastCall:
    """The call a context made last on a host buffer, kept so that the same call again
    (a timed loop, a small message every step) skips every lookup."""

    __slots__ = ("buf", "algo", "op", "plan", "go", "dtype", "ptr", "data_ptr",
                 "is_contiguous", "numel")

    def __init__(self, buf=None, algo=None, op=None, plan=None, go=None, tensor=False):
        self.buf, self.algo, self.op, self.plan, self.go = buf, algo, op, plan, go
        self.dtype = None if buf is None else buf.dtype
        # A tensor's memory is checked by address, and its bound methods are kept: looking
        # them up costs more than calling them. An array is kept alive (and so cannot be
        # resized in place) by the reference above.
        self.ptr = buf.data_ptr() if tensor else None
        self.data_ptr = buf.data_ptr if tensor else None
        self.is_contiguous = buf.is_contiguous if tensor else None
        self.numel = buf.numel if tensor else None


#: ``Context.last_call`` when no call is at hand.
NO_CALL = LastCall()
