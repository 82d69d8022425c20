"""Allreduce and the collectives of per-rank blocks, written by hand in Python over mpi4py,
one algorithm per module, chosen by name.

    from hpctrain.collectives import (allreduce, allgather, reduce_scatter, alltoall,
                                      broadcast, reduce)
    allreduce(grad, op="avg", algo="ring")          # in place, on every rank
    allgather(shard, full, counts, algo="ring")     # every rank's block, on every rank
    reduce_scatter(grad, shard, counts, op="sum")   # this rank's block of the sum
    alltoall(send, sendcounts, recv, recvcounts)    # block j to rank j
    broadcast(buf, root=0, algo="tree")             # root's buf on every rank
    reduce(grad, total, op="sum", root=0)           # the sum in total, on the root only

Allreduce algorithms (``ALGORITHMS``):

- ``ring``: reduce-scatter + allgather around a ring;
- ``tree``: binomial-tree reduce, then broadcast (``root=0``);
- ``butterfly``: recursive doubling, Rabenseifner from ``switch_bytes=65536``;
- ``ps``: one parameter server, point-to-point (``root=0``);
- ``ps-sharded``: ``k`` servers, one shard each (``servers=p``);
- ``hierarchical``: reduce-scatter in each node, ring between nodes, allgather in each
  node (``ranks_per_node=0``: by shared memory);
- ``mpi``: the MPI library's ``Allreduce`` (baseline);
- ``horovod``: ``hvd.allreduce`` (baseline; needs Horovod);
- ``auto``: one of the above per message size, from a study's profile (``auto.use``, or
  the file ``$HPCTRAIN_ALLREDUCE_PROFILE`` names, default ``runs/study-allreduce/params.json``).

``DEFAULT_ALLREDUCE`` (``ring``) is the choice where none is named; ``$HPCTRAIN_ALLREDUCE``
(``ENV_ALLREDUCE``) names one from the launch line for ``hpctrain train`` and
``hpctrain.torch`` alike.

allgather: ``ring``, ``butterfly``, ``mpi``; reduce_scatter: ``ring``, ``butterfly``,
``mpi``; alltoall: ``pairwise``, ``mpi``; broadcast: ``tree``, ``scatter_allgather``, ``mpi``;
reduce: ``tree``, ``mpi`` (``REGISTRIES``; :func:`companion` names the one that goes with an
allreduce algorithm).

The package, one concept per module (docs/collectives.md has the table): ``dtypes`` (element
types and ops), ``kernels`` (the reduction kernels), ``algorithm`` (the interface every
algorithm implements), ``registry`` (the registries, ``@register``, ``@interface``,
``companion``), ``bench_plugin`` (a collective's benchmark), ``check`` (the mismatch check),
``contexts`` (the per-communicator cache), ``plans`` (a call planned once), ``buffers``
(flattening, staging, fusing), ``arguments`` (the calls' argument checks), ``driver``
(``allreduce``, ``allreduce_fused``), one module per other collective with its interface,
bench plug-in and call (``allgather_call.py``, ``reducescatter_call.py``,
``alltoall_call.py``, ``broadcast_call.py``, ``reduce_call.py``), ``cost`` (the α-β-γ
model), then one module per algorithm (``ring.py``, ..., ``allgather_ring.py``,
``alltoall_pairwise.py``, ``broadcast_tree.py``, ``reduce_tree.py``, ...). Every allreduce
algorithm takes the same buffers (NumPy arrays, torch tensors on CPU or CUDA), dtypes
(``DTYPES``) and ops (``OPS``) and reduces on a private duplicate of the communicator.
docs/collectives.md gives each algorithm's cost and where it should win.
"""

import importlib.util

# Each algorithm module registers itself; the order of these imports fixes the tags.
from . import ring, tree, butterfly, ps, hierarchical, mpi, horovod  # noqa: F401
from . import allgather_ring, allgather_butterfly, allgather_mpi  # noqa: F401
from . import reducescatter_ring, reducescatter_butterfly, reducescatter_mpi  # noqa: F401
from . import alltoall_pairwise, alltoall_mpi  # noqa: F401
from . import broadcast_tree, broadcast_scatter_allgather, broadcast_mpi  # noqa: F401
from . import reduce_tree, reduce_mpi  # noqa: F401
from . import auto, cost  # noqa: F401
from .algorithm import Algorithm
from .allgather_call import allgather
from .alltoall_call import alltoall
from .broadcast_call import broadcast
from .check import MismatchError
from .contexts import context
from .driver import allreduce, allreduce_fused
from .dtypes import DTYPES, OPS
from .reduce_call import reduce
from .reducescatter_call import reduce_scatter
from .registry import ALGORITHMS, DEFAULT_ALLREDUCE, ENV_ALLREDUCE, REGISTRIES, companion

__all__ = ["ALGORITHMS", "COLLECTIVES", "DEFAULT_ALLREDUCE", "ENV_ALLREDUCE", "REGISTRIES",
           "auto", "cost", "DTYPES", "OPS", "Algorithm", "MismatchError", "allgather",
           "allreduce", "allreduce_fused", "alltoall", "available", "broadcast", "companion",
           "context", "reduce", "reduce_scatter"]


def __getattr__(name):
    # COLLECTIVES: the registries' names, a collective declared later included.
    if name == "COLLECTIVES":
        return tuple(REGISTRIES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def available(collective="allreduce"):
    """Names of the ``collective``'s algorithms that can run here (allreduce: ``horovod``
    only where it is installed)."""
    names = sorted(REGISTRIES[collective])
    if "horovod" in names and not _importable("horovod.torch"):
        names.remove("horovod")
    return names


def _importable(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False
