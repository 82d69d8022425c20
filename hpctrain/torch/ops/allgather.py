"""Allgather: ``allgather_async``, ``grouped_allgather_async``, ``allgather_object``, and
the operation that is an allgather's gradient (:func:`scatter_rows`).

Every rank's tensor is concatenated along dimension 0, in the process set's rank order; the
first dimension may differ between ranks (each rank tells the others its own in the
negotiation, so no extra message is needed), the other dimensions, the dtype and the device
may not. Any dtype moves, bool included. The gradient of an allgather is, as in Horovod, the
average of the incoming gradients over the ranks, of which each keeps its own rows: a
reduce-scatter (``Average``) of the gradient. The differentiable ``allgather`` and
``grouped_allgather`` are in :mod:`.autograd`.
"""

import math

import torch

from .common import (Average, check_tensor, describe_tensors, object_call, on_thread,
                     rows_moved, signature, start, submit, synchronize)
from ..process_sets import global_process_set


def _check(tensors, function):
    def check(pset):
        for t in tensors:
            check_tensor(t, function, reduced=False)
            if t.dim() == 0:
                raise ValueError(f"hpctrain.torch.{function} takes tensors of at least one "
                                 f"dimension (it concatenates along dimension 0), got a scalar")
    return check


def gather_into(comm, algo, tensors, rows):
    """On the communication thread: the allgather of each tensor of ``tensors``, given the
    rows of every rank (``rows[i][r]``: tensor i's first dimension on set rank r)."""
    from ... import collectives

    outputs = []
    for i, tensor in enumerate(tensors):
        counts = [r[i] for r in rows]
        outputs.append(rows_moved(comm, tensor, counts, lambda send, recv, width, counts=counts:
                                  collectives.allgather(send, recv, [c * width for c in counts],
                                                        algo=algo, comm=comm)))
    return outputs


def grouped_allgather_async(tensors, name=None, process_set=global_process_set,
                            function="grouped_allgather_async", single=False):
    """Queue the allgather of every tensor of ``tensors`` as one operation; return a handle
    whose :func:`synchronize` gives the list of gathered tensors."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"hpctrain.torch.{function} takes a list of tensors")
    tensors = list(tensors)
    w, pset, name, _ = start(function, name, process_set, _check(tensors, function))
    algo = w.algorithm_for("allgather")

    def work(comm, infos):
        outputs = gather_into(comm, algo, tensors, infos)
        return outputs[0] if single else outputs

    return submit(w, pset, name, signature("allgather", tensors, ragged=True),
                  describe_tensors("allgather", name, tensors),
                  on_thread(tensors, work), info=[t.shape[0] for t in tensors])


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Queue the allgather of ``tensor``; return a handle for :func:`synchronize`."""
    return grouped_allgather_async([tensor], name, process_set, "allgather_async", single=True)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's ``obj`` (any picklable object), as a list in rank order. A collective."""
    return object_call("allgather_object", name, process_set,
                       lambda comm: comm.allgather(obj))


def scatter_rows(grads, rows, process_set):
    """The gradient of an allgather: the average of ``grads`` (the gathered shape) over the
    ranks, of which each keeps its own ``rows[i]`` rows of tensor ``i`` — a reduce-scatter
    whose blocks are the ranks' first dimensions, which each rank tells the others."""
    from ... import collectives

    w, pset, name, _ = start("allgather (gradient)", None, process_set, lambda pset: None)
    algo = w.algorithm_for("reducescatter")

    def work(comm, infos):
        size = comm.Get_size()
        outputs = []
        for i, grad in enumerate(grads):
            rest = tuple(grad.shape[1:])
            width = math.prod(rest)
            mine = infos[comm.Get_rank()][i]
            out = torch.empty((mine,) + rest, dtype=grad.dtype, device=grad.device)
            if size == 1:
                out.copy_(grad)
            else:
                collectives.reduce_scatter(grad.detach().clone().view(-1), out.view(-1),
                                           [r[i] * width for r in infos], op="avg",
                                           algo=algo, comm=comm)
            outputs.append(out)
        return outputs

    agreed = signature("allgather_grad", grads, Average, 1.0, 1.0)
    return synchronize(submit(w, pset, name, agreed,
                              describe_tensors("allgather_grad", name, grads),
                              on_thread(grads, work), info=list(rows)))
