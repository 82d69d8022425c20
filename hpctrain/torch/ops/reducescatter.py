"""Reduce-scatter: ``reducescatter_async``, ``grouped_reducescatter_async``.

Each tensor is reduced over the ranks of the process set and cut along dimension 0: set rank
``r`` keeps rows ``[lo_r, hi_r)``, the rows split as evenly as they go, the first
``rows % size`` ranks one more. Ops ``Sum`` and ``Average`` (an integer average truncates
towards zero), with ``prescale_factor``/``postscale_factor`` as allreduce. The
differentiable ``reducescatter`` and ``grouped_reducescatter`` are in :mod:`.autograd` (the
gradient is an allgather).
"""

import math

import torch

from .common import (Average, OP_NAMES, Sum, WIDENED, check_tensor, describe_tensors,
                     on_thread, resolve_op, scaled, signature, start, submit)
from ..process_sets import global_process_set


def row_split(rows, size):
    """Rows of each of ``size`` ranks when ``rows`` are cut as evenly as they go."""
    base, extra = divmod(rows, size)
    return [base + (r < extra) for r in range(size)]


def scatter_into(comm, algo, tensors, op, prescale, postscale):
    """On the communication thread: this rank's block of each tensor's reduction."""
    from ... import collectives

    size, rank = comm.Get_size(), comm.Get_rank()
    outputs = []
    for tensor in tensors:
        rows = row_split(tensor.shape[0], size)
        rest = tuple(tensor.shape[1:])
        width = math.prod(rest)
        wide = WIDENED.get(tensor.dtype)
        work = tensor.detach().to(wide if wide is not None else tensor.dtype, copy=True)
        work = scaled(work.contiguous().view(-1), prescale)
        out = torch.empty(rows[rank] * width, dtype=work.dtype, device=work.device)
        integer = not work.dtype.is_floating_point
        name = "sum" if op == Average and integer else OP_NAMES[op]
        if size == 1:
            out.copy_(work)
        else:
            collectives.reduce_scatter(work, out, [r * width for r in rows], op=name,
                                       algo=algo, comm=comm)
        if op == Average and integer:
            out.copy_(torch.div(out, size, rounding_mode="trunc"))
        out = scaled(out, postscale).to(tensor.dtype).view((rows[rank],) + rest)
        outputs.append(out)
    return outputs


def _check(tensors, op, function):
    def check(pset):
        for t in tensors:
            check_tensor(t, function)
            if t.dim() == 0:
                raise ValueError(f"hpctrain.torch.{function} cannot scatter a scalar: it "
                                 f"cuts dimension 0 over the ranks")
        if op not in (Sum, Average):
            raise NotImplementedError(f"hpctrain.torch.{function} reduces with op=hvd.Sum or "
                                      f"hvd.Average only, got op={op}")
    return check


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0,
                                function="grouped_reducescatter_async", single=False):
    """Queue the reduce-scatter of every tensor of ``tensors`` as one operation."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"hpctrain.torch.{function} takes a list of tensors")
    tensors = list(tensors)
    op = resolve_op(None, op, adasum=False) if op in OP_NAMES else op
    w, pset, name, _ = start(function, name, process_set, _check(tensors, op, function))
    algo = w.algorithm_for("reducescatter")

    def work(comm, infos):
        out = scatter_into(comm, algo, tensors, op, prescale_factor, postscale_factor)
        return out[0] if single else out

    return submit(w, pset, name, signature("reducescatter", tensors, op, prescale_factor,
                                            postscale_factor),
                  describe_tensors("reducescatter", name, tensors, op=op),
                  on_thread(tensors, work))


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Queue the reduce-scatter of ``tensor``; return a handle for :func:`synchronize`."""
    return grouped_reducescatter_async([tensor], name, op, process_set, prescale_factor,
                                       postscale_factor, "reducescatter_async", single=True)
