"""The backend for ``HPCTRAIN_ALLREDUCE=horovod``: every call handed to ``horovod.torch``.

Process sets are hpctrain's :class:`ProcessSet` objects on the user's side; this backend
registers a Horovod set beside each and passes Horovod's in their place.
"""

from .process_sets import ProcessSet, global_process_set


class HorovodBackend:
    """``horovod.torch``, started over the world's communicator; attribute access gives
    its functions with hpctrain's process sets translated."""

    def __init__(self, world):
        import horovod.torch as hvd

        hvd.init(comm=world.user_comm)
        self.world = world
        self.hvd = hvd
        self._sets = {0: hvd.global_process_set}

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
        """Shut Horovod down."""
        self.hvd.shutdown()
