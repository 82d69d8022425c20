"""Horovod's module path for the operations: ``from horovod.torch.mpi_ops import
allreduce_async_, synchronize, Sum`` becomes ``from hpctrain.torch.mpi_ops import ...``.

Everything here is the package's own public function (dispatched to the backend ``init``
chose). ``_basics`` answers the one question Horovod's own tests ask of Horovod's private
object of that name: which process sets exist, with which ranks.
"""

from . import *  # noqa: F403 - this module is the package's public names under another path
from . import __all__ as _public_names
from .basics import world as _world


class _Basics:
    """The process-set table, as Horovod's ``mpi_ops._basics`` reports it."""

    @staticmethod
    def _get_process_set_ids_and_ranks():
        """``{process_set_id: [world ranks]}`` of every registered set, the global one too."""
        return {set_id: list(pset.ranks) for set_id, pset in sorted(_world().sets.items())}


_basics = _Basics()

__all__ = list(_public_names)
