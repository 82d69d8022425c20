"""Allreduce: ``allreduce_``, ``allreduce_async(_)``, ``grouped_allreduce_``,
``grouped_allreduce_async(_)``, and the data phase others share (:func:`reduce_flat`).

Semantics of Horovod 0.28: ``op`` defaults to ``Average``; ``average=`` is the old spelling
(not both); an integer average is the sum divided by the number of ranks, truncated towards
zero; ``prescale_factor`` and ``postscale_factor`` multiply before and after the reduction
(integers scaled in float64, half precision in float32). ``Adasum`` is Horovod's adaptive
summation (:mod:`hpctrain.collectives.adasum`, a power-of-two number of ranks). The
differentiable ``allreduce`` and ``grouped_allreduce`` are in :mod:`.autograd`, sparse
allreduce in :mod:`.sparse`.

The data phase is the algorithm chosen at ``init`` (:mod:`hpctrain.collectives`), over the
process set's communicator.
"""

import torch

from .common import (Adasum, Average, OP_NAMES, WIDENED, check_tensor, describe_tensors,
                     on_thread, resolve_op, scaled, signature, start, submit, unsupported,
                     synchronize)
from ..process_sets import global_process_set


def reduce_flat(comm, algo, flat, op, prescale=1.0, postscale=1.0):
    """Reduce the contiguous 1-D ``flat`` in place over ``comm`` with ``algo`` (no check)."""
    scaled(flat, prescale)
    size = comm.Get_size()
    if size > 1:
        if op == Adasum:
            _adasum(comm, flat)
        else:
            _reduce(comm, algo, flat, op, size)
    return scaled(flat, postscale)


def _reduce(comm, algo, flat, op, size):
    from ... import collectives

    integer = not flat.dtype.is_floating_point
    wide = WIDENED.get(flat.dtype)
    work = flat.to(wide) if wide is not None else flat
    if op == Average and integer:
        # Horovod truncates an integer average towards zero; the collectives' "avg" floors.
        collectives.allreduce(work, op="sum", algo=algo, comm=comm, check=False)
        work.copy_(torch.div(work, size, rounding_mode="trunc"))
    else:
        collectives.allreduce(work, op=OP_NAMES[op], algo=algo, comm=comm, check=False)
    if work is not flat:
        flat.copy_(work)


def _adasum(comm, flat):
    from ...collectives.adasum import adasum_allreduce

    adasum_allreduce(flat, comm)


def joined_allreduce(w):
    """The engine's part for a joined rank: the same allreduce, of zeros."""
    def run(comm, signature):
        for shape, dtype in zip(signature.shapes, signature.dtypes):
            zeros = torch.zeros(shape, dtype=getattr(torch, dtype)).view(-1)
            reduce_flat(comm, w.algo, zeros, signature.op, signature.prescale,
                        signature.postscale)
    return run


def _grouped_async(tensors, outputs, average, name, op, prescale_factor, postscale_factor,
                   process_set, function):
    """Queue the reduction of ``tensors`` into ``outputs`` (the same list: in place)."""
    grouped = function.startswith("grouped")

    def check(pset):
        if grouped and not isinstance(tensors, (list, tuple)):
            raise TypeError(f"hpctrain.torch.{function} takes a list of tensors, got "
                            f"{type(tensors).__name__}")
        for t in tensors:
            check_tensor(t, function)
        devices = sorted({str(t.device) for t in tensors})
        if len(devices) > 1:   # as Horovod: one group, one device (a RuntimeError there too)
            raise unsupported(f"tensors on several devices ({', '.join(devices)}) in one "
                              f"{function}", "reduce each device's tensors in a call of its own")
        chosen = resolve_op(average, op)
        if chosen == Adasum and any(not t.dtype.is_floating_point for t in tensors):
            raise TypeError("op=Adasum takes floating-point tensors only")
        return chosen

    w, pset, name, op = start(function, name, process_set, check)
    sources = list(tensors)
    targets = sources if outputs is None else list(outputs)

    def work(comm, infos):
        for out, source in zip(targets, sources):
            if out is not source:
                out.copy_(source.detach())
        _reduce_tensors(comm, w.algo, targets, op, prescale_factor, postscale_factor)
        return targets if grouped else targets[0]

    kind = "allreduce"
    return submit(w, pset, name, signature(kind, sources, op, prescale_factor,
                                            postscale_factor),
                  describe_tensors(kind, name, sources, op=op), on_thread(sources, work))


def _reduce_tensors(comm, algo, tensors, op, prescale, postscale):
    """Reduce every tensor of ``tensors`` in place, one flat buffer per dtype and device."""
    from ..buckets import FlatBuffer

    groups = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for group in groups.values():
        if len(group) == 1 and group[0].is_contiguous():
            reduce_flat(comm, algo, group[0].view(-1), op, prescale, postscale)
            continue
        packed = FlatBuffer(group)
        packed.pack(group)
        reduce_flat(comm, algo, packed.flat, op, prescale, postscale)
        packed.unpack(group)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Queue an allreduce of ``tensor`` into a new tensor; return a handle for
    :func:`synchronize`. A collective of ``process_set``, paired with the others by name."""
    output = [torch.empty_like(tensor)] if isinstance(tensor, torch.Tensor) else None
    return _grouped_async([tensor], output, average, name, op,
                          prescale_factor, postscale_factor, process_set, "allreduce_async")


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Queue an in-place allreduce of ``tensor``; return a handle."""
    return _grouped_async([tensor], None, average, name, op, prescale_factor,
                          postscale_factor, process_set, "allreduce_async_")


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduce ``tensor`` in place over the ranks of ``process_set``; return it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Queue one allreduce of a list of tensors into new tensors; return a handle."""
    outputs = ([torch.empty_like(t) if isinstance(t, torch.Tensor) else t for t in tensors]
               if isinstance(tensors, (list, tuple)) else None)
    return _grouped_async(tensors, outputs, average, name, op, prescale_factor,
                          postscale_factor, process_set, "grouped_allreduce_async")


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """Queue one in-place allreduce of a list of tensors; return a handle."""
    return _grouped_async(tensors, None, average, name, op, prescale_factor,
                          postscale_factor, process_set, "grouped_allreduce_async_")


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """Reduce a list of tensors in place, fused into one collective; return the list."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))
