"""Allreduce, written by hand in Python over mpi4py, one algorithm per module.

    from hpctrain.collectives import allreduce
    allreduce(grad, op="avg", algo="ring")          # in place, on every rank

- ``ring``: reduce-scatter + allgather around a ring;
- ``tree``: binomial-tree reduce, then broadcast (``root=0``);
- ``butterfly``: recursive doubling, Rabenseifner from ``switch_bytes=65536``;
- ``ps``: one parameter server, point-to-point (``root=0``);
- ``ps-sharded``: ``k`` servers, one shard each (``servers=p``);
- ``hierarchical``: reduce-scatter in each node, ring between nodes, allgather in each
  node (``ranks_per_node=0``: by shared memory);
- ``mpi``: the MPI library's ``Allreduce`` (baseline);
- ``horovod``: ``hvd.allreduce`` (baseline; needs Horovod);
- ``auto``: one of the above per message size, from a study's profile (``auto.use``).

The package, one concept per module: ``dtypes`` (element types and ops), ``reduce``
(reduction kernels), ``algorithm`` (the interface and the registry), ``check`` (the
mismatch check), ``context`` (the per-communicator cache), ``buffers`` (flattening, staging,
fusing), ``driver`` (``allreduce``, ``allreduce_fused``), ``cost`` (the α-β-γ model), then
one module per algorithm. Every algorithm takes the same buffers (NumPy arrays, torch
tensors on CPU or CUDA), dtypes (``DTYPES``) and ops (``OPS``) and reduces on a private
duplicate of the communicator. docs/collectives.md gives each algorithm's cost and where it
should win.
"""

import importlib.util

# Each algorithm module registers itself; the order of these imports fixes the tags.
from . import ring, tree, butterfly, ps, hierarchical, mpi, horovod  # noqa: F401
from . import auto, cost  # noqa: F401
from .algorithm import ALGORITHMS, Algorithm
from .check import MismatchError
from .contexts import context
from .driver import allreduce, allreduce_fused
from .dtypes import DTYPES, OPS

__all__ = ["ALGORITHMS", "auto", "cost", "DTYPES", "OPS", "Algorithm", "MismatchError",
           "allreduce", "allreduce_fused", "available", "context"]


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
