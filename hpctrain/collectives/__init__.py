"""Allreduce, written by hand in Python over mpi4py, one algorithm per module.

    from hpctrain.collectives import allreduce
    allreduce(grad, op="avg", algo="ring")          # in place, on every rank

- ``ring``: reduce-scatter + allgather around a ring;
- ``tree``: binomial-tree reduce, then broadcast (``root=0``);
- ``butterfly``: recursive doubling, Rabenseifner from ``switch_bytes=65536``;
- ``ps``: one parameter server, point-to-point (``root=0``);
- ``ps-sharded``: ``k`` servers, one shard each (``servers=p``);
- ``mpi``: the MPI library's ``Allreduce`` (baseline);
- ``horovod``: ``hvd.allreduce`` (baseline; needs Horovod);
- ``auto``: one of the above per message size, from a study's profile (``auto.use``).

Every algorithm takes the same buffers (NumPy arrays, torch tensors on CPU or CUDA), dtypes
(``DTYPES``) and ops (``OPS``) and reduces on a private duplicate of the communicator.
docs/collectives.md gives each algorithm's cost and where it should win.
"""

import importlib.util

from . import auto, butterfly, horovod, mpi, ps, ring, tree  # noqa: F401 - each registers itself
from .base import (ALGORITHMS, DTYPES, OPS, Algorithm, MismatchError, allreduce,
                   allreduce_fused, context)

__all__ = ["ALGORITHMS", "auto", "DTYPES", "OPS", "Algorithm", "MismatchError", "allreduce",
           "allreduce_fused", "available", "context"]


def available():
    """Names of the algorithms that can run here (``horovod`` only where it is installed)."""
    names = sorted(ALGORITHMS)
    if not _importable("horovod.torch"):
        names.remove("horovod")
    return names


def _importable(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False
