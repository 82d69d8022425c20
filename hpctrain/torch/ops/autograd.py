"""The differentiable forms of the operations, with Horovod's gradients: ``allreduce``,
``grouped_allreduce``, ``allgather``, ``grouped_allgather``, ``broadcast``,
``reducescatter``, ``grouped_reducescatter``, ``alltoall``.

The layer above the operations' own modules (:mod:`.allreduce`, :mod:`.allgather`, ...), as
the gradient of one family is an operation of another. Each form runs its family's queued
operation (``..._async``, then :func:`synchronize`), through a ``torch.autograd.Function``
when a tensor requires a gradient. The gradients:

- an allreduce's is the same allreduce of the gradient;
- an allgather's is the average of the gradients over the ranks, of which each keeps its own
  rows (:func:`.allgather.scatter_rows`, a reduce-scatter);
- a broadcast's is that average (an allreduce) on the root and zero elsewhere;
- a reduce-scatter's is the allgather of the gradient (times the number of ranks for
  ``Sum``, times the scale factors);
- an alltoall's is the reverse alltoall of the gradient.
"""

import torch

from .allgather import grouped_allgather_async, scatter_rows
from .allreduce import allreduce_async, grouped_allreduce_async
from .alltoall import alltoall_async
from .broadcast import broadcast_async
from .common import Average, Sum, synchronize
from .reducescatter import grouped_reducescatter_async
from ..basics import world
from ..compression import Compression
from ..process_sets import global_process_set


# ----- allreduce ----------------------------------------------------------------------------

def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """The reduction of ``tensor`` over the ranks of ``process_set``, in a new tensor
    (differentiable). A collective; its semantics are in :mod:`.allreduce`."""
    if not isinstance(tensor, torch.Tensor):
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                           postscale_factor, process_set))
    wire, ctx = compression.compress(tensor)
    if wire.requires_grad:
        # One autograd function for one tensor or many: the gradient of each is reduced the
        # same way as the tensor was.
        reduced = _GroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor,
                                          process_set, wire)[0]
    else:
        reduced = synchronize(allreduce_async(wire, average, name, op, prescale_factor,
                                              postscale_factor, process_set))
    return compression.decompress(reduced, ctx)


class _GroupedAllreduce(torch.autograd.Function):
    """Allreduce of tensors with a gradient: each gradient is reduced as its tensor was."""

    @staticmethod
    def forward(ctx, average, name, op, prescale, postscale, process_set, *tensors):
        ctx.args = (average, op, prescale, postscale, process_set)
        return tuple(synchronize(grouped_allreduce_async(list(tensors), average, name, op,
                                                         prescale, postscale, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        average, op, prescale, postscale, process_set = ctx.args
        reduced = grouped_allreduce([g.contiguous() for g in grads], average, None,
                                    Compression.none, op, prescale, postscale, process_set)
        return (None, None, None, None, None, None, *reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """The reductions of a list of tensors, in new tensors, as one collective
    (differentiable)."""
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.Tensor)
                                                         for t in tensors):
        return synchronize(grouped_allreduce_async(tensors, average, name, op,
                                                   prescale_factor, postscale_factor,
                                                   process_set))
    pairs = [compression.compress(t) for t in tensors]
    wires = [p for p, _ in pairs]
    if any(t.requires_grad for t in wires):
        reduced = _GroupedAllreduce.apply(average, name, op, prescale_factor,
                                          postscale_factor, process_set, *wires)
    else:
        reduced = synchronize(grouped_allreduce_async(wires, average, name, op,
                                                      prescale_factor, postscale_factor,
                                                      process_set))
    return [compression.decompress(r, c) for r, (_, c) in zip(reduced, pairs)]


# ----- allgather ----------------------------------------------------------------------------

class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, process_set, name, *tensors):
        ctx.process_set = process_set
        ctx.rows = [t.shape[0] for t in tensors]
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *scatter_rows([g.contiguous() for g in grads], ctx.rows,
                                          ctx.process_set))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Each tensor of ``tensors`` gathered from every rank (differentiable), as one
    collective of ``process_set``."""
    if isinstance(tensors, (list, tuple)) and any(isinstance(t, torch.Tensor) and
                                                  t.requires_grad for t in tensors):
        return list(_Allgather.apply(process_set, name, *tensors))
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's ``tensor`` concatenated along dimension 0 (differentiable). A collective."""
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
        return _Allgather.apply(process_set, name, tensor)[0]
    return synchronize(grouped_allgather_async([tensor], name, process_set, "allgather",
                                               single=True))


# ----- broadcast ----------------------------------------------------------------------------

class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.args = (root_rank, process_set)
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        root_rank, process_set = ctx.args
        reduced = allreduce(grad.contiguous(), average=True, process_set=process_set)
        if world().rank != root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """``root_rank``'s ``tensor`` on every rank of the set, in a new tensor (differentiable)."""
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
        return _Broadcast.apply(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


# ----- reducescatter ------------------------------------------------------------------------

class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale, postscale, *tensors):
        ctx.args = (op, process_set, prescale, postscale)
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale, postscale)))

    @staticmethod
    def backward(ctx, *grads):
        op, process_set, prescale, postscale = ctx.args
        factor = (process_set.size() if op == Sum else 1) * prescale * postscale
        grads = [g.contiguous() * factor if factor != 1 else g.contiguous() for g in grads]
        return (None, None, None, None, None, *grouped_allgather(grads, None, process_set))


def grouped_reducescatter(tensors, name=None, compression=None, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """This rank's block of each tensor's reduction (differentiable), as one collective."""
    if isinstance(tensors, (list, tuple)) and any(isinstance(t, torch.Tensor) and
                                                  t.requires_grad for t in tensors):
        return list(_Reducescatter.apply(name, op, process_set, prescale_factor,
                                         postscale_factor, *tensors))
    return synchronize(grouped_reducescatter_async(tensors, name, op, process_set,
                                                   prescale_factor, postscale_factor))


def reducescatter(tensor, name=None, compression=None, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """This rank's block (rows) of the reduction of ``tensor`` over the ranks
    (differentiable). A collective."""
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
        return _Reducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                    tensor)[0]
    return synchronize(grouped_reducescatter_async([tensor], name, op, process_set,
                                                   prescale_factor, postscale_factor,
                                                   "reducescatter", single=True))


# ----- alltoall -----------------------------------------------------------------------------

class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _received_grad):
        back, _ = synchronize(alltoall_async(grad.contiguous(), ctx.received, None,
                                             ctx.process_set))
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatter blocks of ``tensor`` to every rank and gather theirs (differentiable).

    Returns the gathered tensor, and with ``splits`` given, also the received splits.
    A collective of ``process_set``.
    """
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
        out, received = _Alltoall.apply(tensor, splits, name, process_set)
    else:
        out, received = synchronize(alltoall_async(tensor, splits, name, process_set,
                                                   "alltoall"))
    return out if splits is None else (out, received)
