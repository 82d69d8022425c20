"""The argument checks the calls of the collectives beside allreduce share (each in its
module, ``allgather_call.py``, ...): ranks, per-rank block counts, buffer lengths, dtypes
and places.

Unlike :func:`~.driver.allreduce`, those calls make no agreement check: the caller
negotiates sizes (``hpctrain.torch`` does). Arguments wrong on this rank raise a
``UsageError`` there, before any message is sent (even the first use of a communicator's
context, which duplicates it collectively, waits until the arguments are checked), saying
what is wrong and what would be right.

``counts[r]`` is the number of elements of rank ``r``'s block; blocks lie side by side in
rank order, rank ``r``'s at ``sum(counts[:r])``. Counts may differ and may be 0.
"""

import numbers
import operator
from itertools import accumulate

from ..errors import UsageError
from .buffers import flatten_bytes


def rank_of(what, root, size):
    """``root`` as an ``int`` if it is a rank of a communicator of ``size`` ranks; a
    ``UsageError`` giving the valid range otherwise."""
    if isinstance(root, bool) or not isinstance(root, numbers.Integral) \
            or not 0 <= root < size:
        raise UsageError(f"{what}: root={root!r} is not a rank of the communicator: "
                         f"valid values are 0 to {size - 1}")
    return int(root)


def block_bounds(counts, size, what, name):
    """The ``size + 1`` element offsets of the blocks of ``counts`` (one count per rank,
    integers >= 0); a ``UsageError`` saying what is wrong otherwise."""
    try:
        values = [operator.index(c) for c in counts]
    except TypeError:
        raise UsageError(f"{what}: {name} must be a sequence of {size} integers (one "
                         f"element count per rank), got {counts!r}") from None
    if len(values) != size:
        raise UsageError(f"{what}: {name} has {len(values)} entries, but the communicator "
                         f"has {size} ranks: give one element count per rank")
    negative = [i for i, c in enumerate(values) if c < 0]
    if negative:
        raise UsageError(f"{what}: {name}[{negative[0]}] = {values[negative[0]]} is "
                         f"negative: counts are numbers of elements, 0 or more")
    return (0, *accumulate(values))


def byte_views(what, send, recv):
    """``((send_bytes, recv_bytes), itemsize, device)``: both buffers as flat ``uint8``
    views, after checking they hold one dtype in one place."""
    send_bytes, send_type, send_device = flatten_bytes(send, what, writes=False)
    recv_bytes, recv_type, recv_device = flatten_bytes(recv, what, writes=True)
    same_type_and_place(what, (send_type, send_device), (recv_type, recv_device))
    return (send_bytes, recv_bytes), _itemsize(send), send_device


def same_type_and_place(what, send, recv):
    """A ``UsageError`` unless ``send`` and ``recv`` (``(dtype name, device)``) agree."""
    if send[0] != recv[0]:
        raise UsageError(f"{what}: send is {send[0]} but recv is {recv[0]}: both buffers "
                         f"must have the same dtype")
    if send[1] != recv[1]:
        raise UsageError(f"{what}: send is in {_place(send[1])} but recv is in "
                         f"{_place(recv[1])}: both buffers must be in the same place")


def expect_length(what, name, buf, count, meaning):
    """A ``UsageError`` unless ``buf`` has ``count`` elements."""
    have = _numel(buf)
    if have != count:
        raise UsageError(f"{what}: {name} has {have} elements, but {meaning} is {count}: "
                         f"pass a {name} buffer of {count} elements")


def _numel(buf):
    return buf.size if hasattr(buf, "flags") else buf.numel()


def _itemsize(buf):
    return buf.itemsize if hasattr(buf, "flags") else buf.element_size()


def _place(device):
    return "host memory" if device is None else f"CUDA device {device}"
