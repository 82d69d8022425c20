"""The backends that the public functions of :mod:`hpctrain.torch` hand every call to: one
is chosen at ``init`` and kept as ``world.backend``.

- :data:`NATIVE` (a :class:`NativeBackend`): hpctrain's own functions, from :mod:`.ops`,
  :mod:`.functions` and :mod:`.optimizer`;
- :class:`HorovodBackend`, for ``allreduce="horovod"``: the same names in ``horovod.torch``,
  with hpctrain's process sets translated into Horovod's.

Both offer every name of :data:`DISPATCHED`, and ``shutdown``. Before ``init``,
:func:`backend` is :data:`NATIVE`, whose functions raise Horovod's ``ValueError`` (not
initialized).
"""

from . import functions, ops
from .basics import is_initialized, world
from .optimizer import DistributedOptimizer
from .process_sets import ProcessSet, global_process_set
from ..collectives import horovod

#: Every public function that goes through the backend: the operations of :mod:`.ops`
#: (:data:`~hpctrain.torch.ops.OPERATIONS`) and three of the others.
DISPATCHED = ops.OPERATIONS + ("broadcast_parameters", "broadcast_optimizer_state",
                    "DistributedOptimizer")


class NativeBackend:
    """hpctrain's own functions under the names of :data:`DISPATCHED`:
    ``NATIVE.allreduce`` is :func:`hpctrain.torch.ops.allreduce`, and so on."""

    def __init__(self):
        for name in ops.OPERATIONS:
            setattr(self, name, getattr(ops, name))
        self.broadcast_parameters = functions.broadcast_parameters
        self.broadcast_optimizer_state = functions.broadcast_optimizer_state
        self.DistributedOptimizer = DistributedOptimizer

    def shutdown(self):
        """Nothing of its own to stop: the world's ``close`` ends the engine."""


NATIVE = NativeBackend()


def backend():
    """The backend the public functions call: ``world.backend`` after ``init``, else
    :data:`NATIVE`."""
    return world().backend if is_initialized() else NATIVE


class HorovodBackend:
    """``horovod.torch``, started over the world's communicator by
    :func:`hpctrain.collectives.horovod.start` (the one start that the ``horovod`` allreduce
    algorithm shares); attribute access gives its functions with hpctrain's process sets
    translated.

    Process sets are hpctrain's :class:`ProcessSet` objects on the user's side: a Horovod set
    is registered beside each, and passed in its place."""

    def __init__(self, world):
        self.world = world
        self.hvd = horovod.start(world.user_comm)
        self._sets = {0: self.hvd.global_process_set}

    def _translate(self, value):
        if isinstance(value, ProcessSet):
            return self._sets.get(value.process_set_id, value)
        return value

    def __getattr__(self, name):
        function = getattr(self.hvd, name)

        def call(*args, **kwargs):
            args = [self._translate(a) for a in args]
            kwargs = {k: self._translate(v) for k, v in kwargs.items()}
            return function(*args, **kwargs)
        call.__name__ = name
        setattr(self, name, call)       # made once: later calls do not come here
        return call

    def add_process_set(self, process_set):
        """Register the set with Horovod and number ours alike."""
        pset = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
        theirs = self.hvd.add_process_set(self.hvd.ProcessSet(self.world.resolve_ranks(pset)))
        pset._register(theirs.process_set_id, list(theirs.ranks), None, self.world.rank)
        self._sets[theirs.process_set_id] = theirs
        return pset

    def remove_process_set(self, process_set):
        """Remove the set from Horovod and forget ours."""
        theirs = self._sets.pop(getattr(process_set, "process_set_id", None), None)
        if theirs is None or process_set is global_process_set:
            return False
        removed = self.hvd.remove_process_set(theirs)
        process_set._forget()
        return removed

    def DistributedOptimizer(self, optimizer, bucket_mb=None, overlap=True, **options):  # noqa: N802
        """Horovod's optimizer; hpctrain's own options (``bucket_mb``, ``overlap``) have no
        meaning there (Horovod fuses by ``HOROVOD_FUSION_THRESHOLD``) and are dropped."""
        if "process_set" in options:
            options["process_set"] = self._translate(options["process_set"])
        return self.hvd.DistributedOptimizer(optimizer, **options)

    def shutdown(self):
        """Stop Horovod (:func:`hpctrain.collectives.horovod.shutdown`: if it was started
        here, not by the script)."""
        horovod.shutdown()
