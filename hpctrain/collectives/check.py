"""The mismatch check: one small allreduce that proves every rank made the same call.

A call is described by a vector of :data:`CHECK_FIELDS` (integers); ``[fields, -fields]``
reduced with ``MAX`` gives every rank the maximum and the minimum of each field, so every
rank sees the same disagreement and raises :class:`MismatchError` together.
"""

import zlib

import numpy as np

from ..errors import UsageError
from .dtypes import DTYPES, OPS
from .registry import ALGORITHMS

#: Fields of the mismatch check, in the order of its vector.
CHECK_FIELDS = ("valid", "count", "dtype", "op", "algo", "options", "layout")
_LOW = np.iinfo(np.int64).min  # a contribution that changes neither the MAX nor the MIN


def algorithm_code(name):
    """The number the mismatch check compares for an algorithm (the same on every rank)."""
    return zlib.crc32(name.encode())


class MismatchError(UsageError):
    """Ranks called the same collective with different arguments (count, dtype, op, ...).

    Raised on every rank of the communicator at once: no rank is left waiting.
    """


def call_vector(algo, op, dtype, count, params):
    """The check vector of a valid call: the fields, then their negatives."""
    values = (1, count, dtype.code, OPS[op], algorithm_code(algo),
              zlib.crc32(repr(params).encode()), 0)
    return np.array(values + tuple(-v for v in values), dtype=np.int64)


def with_layout(vector, sizes):
    """A copy of ``vector`` that also compares the fused tensors' ``sizes``."""
    vector = vector.copy()
    k = len(CHECK_FIELDS)
    vector[k - 1] = zlib.crc32(repr(sizes).encode())
    vector[2 * k - 1] = -vector[k - 1]
    return vector


def empty_vector():
    """The check vector of a valid call with nothing to reduce (no tensors)."""
    k = len(CHECK_FIELDS)
    vector = np.zeros(2 * k, dtype=np.int64)
    vector[0], vector[k] = 1, -1
    return vector


def invalid_vector():
    """The check vector of a rank that rejected its own arguments: ``valid = 0`` and
    neutral values for the rest."""
    vector = np.full(2 * len(CHECK_FIELDS), _LOW, dtype=np.int64)
    vector[0] = vector[len(CHECK_FIELDS)] = 0
    return vector


def mismatch_message(recv, mine, plan):
    """What differs between the ranks, from the reduced vector ``recv`` and this rank's."""
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
