"""``torch.distributed``'s reduction ops on hpctrain's collectives.

Each c10d ``ReduceOp`` becomes one :class:`Reduction`: ``SUM``, ``AVG``, ``MIN``, ``MAX`` and
``PRODUCT`` are the collectives' own ops (``AVG`` of integers truncates towards zero, as
``hpctrain.torch``'s ``Average``); ``PREMUL_SUM`` (FSDP2's and HSDP's gradient op) scales
every rank's input by its factor, then sums; ``BAND``, ``BOR`` and ``BXOR``, which no
allreduce algorithm of ours computes, gather every rank's vector and fold it here (integer
and bool tensors only). The dtypes MPI cannot carry travel as hpctrain.torch's do: float16
and bfloat16 as 16-bit integers reduced in their own precision by the collectives, the small
integer types and bool widened to int32 (:data:`hpctrain.torch.ops.common.WIDENED`).
"""

from typing import NamedTuple

import torch

from .versions import premul_factor
from ..ops.allreduce import reduce_flat
from ..ops.common import Average, Max, Min, Product, REDUCED, Sum, WIDENED, scaled

#: c10d ops that the collectives compute, to hpctrain.torch's op numbers.
ARITHMETIC = {"SUM": Sum, "AVG": Average, "MIN": Min, "MAX": Max, "PRODUCT": Product}
#: c10d's bitwise ops, folded from an allgather.
BITWISE = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}
#: hpctrain.torch's op numbers to the collectives' op names.
NAMES = {Sum: "sum", Average: "avg", Min: "min", Max: "max", Product: "prod"}


class Reduction(NamedTuple):
    """One c10d reduction: its name (``"SUM"``, ..., ``"PREMUL_SUM"``, ``"BAND"``) and the
    factor ``PREMUL_SUM`` multiplies by first (1.0 for the others)."""

    name: str
    factor: float = 1.0

    @property
    def op(self):
        """hpctrain.torch's op number (``PREMUL_SUM`` sums)."""
        return Sum if self.name == "PREMUL_SUM" else ARITHMETIC.get(self.name)

    @property
    def bitwise(self):
        """The elementwise torch function of a bitwise op (``None`` for the others)."""
        return BITWISE.get(self.name)


def reduction(reduce_op):
    """The :class:`Reduction` of a c10d ``ReduceOp`` (or its ``RedOpType``)."""
    kind = getattr(reduce_op, "op", reduce_op)
    name = kind.name
    if name == "PREMUL_SUM":
        return Reduction(name, premul_factor(reduce_op))
    if name not in ARITHMETIC and name not in BITWISE:
        raise ValueError(f"the hpctrain backend does not know ReduceOp.{name}")
    return Reduction(name)


def check_dtype(tensor, chosen, function):
    """``TypeError`` (before anything is sent) unless ``chosen`` can reduce ``tensor``'s
    dtype: the collectives' dtypes and those that travel widened; bitwise ops integers and
    bool only."""
    dtype = tensor.dtype
    if dtype not in REDUCED and dtype not in WIDENED:
        raise TypeError(f"{function}: the hpctrain backend cannot reduce {dtype}; reducible "
                        f"dtypes: {', '.join(sorted(str(d) for d in REDUCED | set(WIDENED)))}")
    if chosen.bitwise is not None and dtype.is_floating_point:
        raise TypeError(f"{function}: ReduceOp.{chosen.name} takes integer or bool tensors, "
                        f"got {dtype}")


def allreduce_flat(comm, algo, gather_algo, flat, chosen):
    """Reduce the contiguous 1-D ``flat`` in place over ``comm`` (a collective)."""
    if chosen.bitwise is not None:
        _fold(comm, gather_algo, flat, chosen.bitwise)
        return flat
    if chosen.factor != 1.0:
        scaled(flat, chosen.factor)
    return reduce_flat(comm, algo, flat, chosen.op)


def _fold(comm, algo, flat, combine):
    from ... import collectives

    size = comm.Get_size()
    if size == 1 or flat.numel() == 0:
        return
    rows = torch.empty((size, flat.numel()), dtype=flat.dtype, device=flat.device)
    collectives.allgather(flat, rows.view(-1), [flat.numel()] * size, algo, comm)
    folded = rows[0].clone()
    for row in rows[1:]:
        combine(folded, row, out=folded)
    flat.copy_(folded)


def direct(dtype, chosen):
    """True when the collectives' reduce-scatter and reduce take ``dtype`` and ``chosen`` as
    they are (the others go through an allreduce of the whole vector)."""
    return chosen.bitwise is None and dtype in REDUCED and not (
        chosen.op == Average and not dtype.is_floating_point)


def reduce_scatter_flat(comm, w, send, recv, counts, chosen):
    """Reduce ``send`` (every block, used as workspace) over ``comm``; this rank's block into
    ``recv`` (a collective)."""
    from ... import collectives

    rank = comm.Get_rank()
    if not direct(send.dtype, chosen):
        allreduce_flat(comm, w.algo, w.algorithm_for("allgather"), send, chosen)
        start = sum(counts[:rank])
        recv.copy_(send[start:start + counts[rank]])
        return
    if chosen.factor != 1.0:
        scaled(send, chosen.factor)
    if comm.Get_size() == 1:
        recv.copy_(send)
        return
    collectives.reduce_scatter(send, recv, counts, NAMES[chosen.op],
                               w.algorithm_for("reducescatter"), comm)


def reduce_to_root(comm, w, flat, root, chosen):
    """Reduce ``flat`` over ``comm`` into the root's ``flat`` (a collective; off the root
    ``flat`` may be overwritten)."""
    from ... import collectives

    if not direct(flat.dtype, chosen) or comm.Get_size() == 1:
        allreduce_flat(comm, w.algo, w.algorithm_for("allgather"), flat, chosen)
        return
    if chosen.factor != 1.0:
        scaled(flat, chosen.factor)
    mine = comm.Get_rank() == root
    send = flat.clone() if mine else flat
    collectives.reduce(send, flat if mine else None, NAMES[chosen.op], root,
                       w.algorithm_for("reduce"), comm)

