"""Message sizes as nccl-tests writes them: ``8``, ``64K``, ``16M``, ``1G`` (powers of 1024)."""

from ..errors import UsageError
from ..units import SIZE_UNITS as UNITS, parse_size  # noqa: F401 - the one parser, re-exported


def size_range(begin, end, factor):
    """Sizes from ``begin`` to ``end`` bytes, each ``factor`` times the previous (nccl-tests -f)."""
    if begin > end:
        raise UsageError(f"minimum size {begin} B is larger than the maximum {end} B (-b > -e)")
    if factor < 2 and begin != end:
        raise UsageError(f"size factor must be >= 2, got {factor} (-f)")
    if begin == 0 < end:
        # 0 times any factor stays 0: the sweep would silently be the one empty message.
        raise UsageError(f"a sweep cannot start at 0 B (0 x {factor} stays 0): start at 1 B "
                         f"or more (-b), or give -b 0 -e 0 for the empty message alone")
    sizes, size = [], begin
    while size <= end:
        sizes.append(size)
        if size == 0 or factor < 2:
            break
        size *= factor
    return sizes


def format_size(nbytes):
    """``nbytes`` with the largest binary unit that divides it: ``64 KiB``, ``3 B``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"
