"""The state an elastic job keeps: committed in memory (and, in a job with a state folder,
on disk by rank 0), restored after a failure, synced from rank 0 after every reset.

``commit()`` is ``save()`` (plus, in a job with a state folder, rank 0 writing the
committed state there for a restarted job) and ``check_host_updates()``, a collective that
raises :class:`HostsUpdatedInterrupt` on every rank together when the launcher has
published new hosts. ``restore()`` undoes everything since the last commit; ``sync()``
gives every rank rank 0's state. :class:`TorchState` does this for models, optimizers and
:class:`~hpctrain.torch.elastic.sampler.ElasticSampler`, and for any other keyword as a
plain object.
"""

import copy

import torch

from .sampler import ElasticSampler
from ... import elastic_job
from ...data.atomic import atomic_path
from ..basics import rank as world_rank
from ..functions import broadcast_optimizer_state, broadcast_parameters
from ..ops.broadcast import broadcast_object


class HostsUpdatedInterrupt(RuntimeError):
    """Raised at a ``commit`` on every rank together when the job's hosts have changed.

    ``skip_sync``: the state need not be synced afterwards (only ranks went away, so every
    rank left holds the committed state already).
    """

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts have changed")
        self.skip_sync = skip_sync


class State:
    """What one elastic worker keeps: subclasses define ``save``, ``restore`` and ``sync``;
    ``snapshot``/``load_snapshot`` let a restarted job begin from the last commit.

    ``bcast_object`` and ``get_rank`` are accepted for Horovod's signature (the defaults are
    hpctrain.torch's).
    """

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or broadcast_object
        self._rank = get_rank or world_rank
        self._reset_callbacks = []
        self.running = 0            # calls of hvd.elastic.run at work on this state
        self.commits = 0            # commits made (hvd.elastic.run counts resets between)
        self._hosts_version = elastic_job.int_setting(elastic_job.ENV_HOSTS_VERSION, 0, least=0)

    def register_reset_callbacks(self, callbacks):
        """Call each of ``callbacks`` (no arguments) after every reset: a rank lost or
        hosts changed (to scale the learning rate to the new size, say)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        """After the world was started again: ``reset()``, then the callbacks."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Save the state (rank 0 also writes it into the job's state folder, if any), then
        check for new hosts. Synchronisation point: one broadcast (every rank commits
        together). Commits cost a copy of the state: commit every few steps, not every one
        (the steps since the last commit are what a failure loses)."""
        folder = elastic_job.state_dir()
        if folder is not None and not self.running:
            raise RuntimeError(
                "state.commit() was called outside hvd.elastic.run: in an elastic job a "
                "failure there could not be recovered; call it inside the function "
                "decorated with @hvd.elastic.run")
        self.save()
        self.commits += 1
        if folder is not None and self._rank() == 0:
            self.write(folder / elastic_job.STATE_FILE)
        self.check_host_updates()

    def check_host_updates(self):
        """Raise :class:`HostsUpdatedInterrupt` on every rank if the launcher published new
        hosts since this job started. Synchronisation point: one broadcast from rank 0."""
        folder = elastic_job.state_dir()
        version = 0
        if folder is not None and self._rank() == 0:
            version = elastic_job.read_hosts(folder)[0]
        version = self._bcast_object(version)
        if version > self._hosts_version:
            self._hosts_version = version
            raise HostsUpdatedInterrupt(skip_sync=False)

    def write(self, path):
        """Write the committed state to ``path`` (atomically), for a restarted job."""
        with atomic_path(path) as tmp:
            torch.save(self.snapshot(), tmp)

    def read(self, path):
        """Make the state in ``path`` (written by :meth:`write`) the committed one, and
        restore it."""
        self.load_snapshot(torch.load(path, weights_only=False))
        self.restore()

    def snapshot(self):
        """The committed state as one picklable object (for :meth:`write`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be written for a restarted "
                                  f"job: define snapshot() and load_snapshot()")

    def load_snapshot(self, snapshot):
        """Make ``snapshot`` (from :meth:`snapshot`) the committed state."""
        raise NotImplementedError(f"{type(self).__name__} cannot be read back: define "
                                  f"snapshot() and load_snapshot()")

    def save(self):
        """Keep the current state as the committed one (in host memory)."""
        raise NotImplementedError

    def restore(self):
        """Go back to the committed state, undoing everything since."""
        raise NotImplementedError

    def sync(self):
        """Give every rank rank 0's state. A collective."""
        raise NotImplementedError

    def reset(self):
        """After a reset, before the sync (nothing by default)."""


class ObjectState(State):
    """Plain Python objects, given as keywords and kept as attributes; synced with one
    ``broadcast_object``."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def snapshot(self):
        return {"objects": self._saved_state}

    def load_snapshot(self, snapshot):
        self._saved_state = dict(snapshot["objects"])

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, value)


class _Kept:
    """One model, optimizer or sampler of a :class:`TorchState`: its committed
    ``state_dict`` (a deep copy), and how to sync it from rank 0."""

    def __init__(self, value):
        self.value = value
        self.saved = None
        self.save()

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)
        abandon = getattr(self.value, "abandon_step", None)
        if abandon is not None:
            abandon()       # a DistributedOptimizer: drop the failed step's buckets

    def sync(self):
        if isinstance(self.value, torch.nn.Module):
            broadcast_parameters(self.value.state_dict(), root_rank=0)
        elif isinstance(self.value, torch.optim.Optimizer):
            broadcast_optimizer_state(self.value, root_rank=0)
        else:
            self.value.load_state_dict(broadcast_object(self.value.state_dict()))


#: The kinds of object whose state a TorchState keeps by ``state_dict``.
KEPT_TYPES = (torch.nn.Module, torch.optim.Optimizer, ElasticSampler)


class TorchState(ObjectState):
    """The state of a PyTorch training process: ``model``, ``optimizer`` and any other
    keyword, each an attribute. Models, optimizers and elastic samplers are kept by their
    ``state_dict`` and synced from rank 0 with ``broadcast_parameters``,
    ``broadcast_optimizer_state`` and ``broadcast_object``; anything else as an
    :class:`ObjectState` keeps it. Assigning a new model or optimizer to the attribute
    keeps the new one (and commits it)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        kept = {k: _Kept(v) for k, v in kwargs.items() if isinstance(v, KEPT_TYPES)}
        object.__setattr__(self, "_kept", kept)
        for name, entry in kept.items():
            object.__setattr__(self, name, entry.value)
        super().__init__(**{k: v for k, v in kwargs.items() if k not in kept})

    def save(self):
        for entry in self._kept.values():
            entry.save()
        super().save()

    def restore(self):
        for entry in self._kept.values():
            entry.restore()
        super().restore()

    def sync(self):
        # The synced state is the committed one: a failure before the first commit then
        # restores rank 0's state on every rank, not each rank's own from before the sync.
        for entry in self._kept.values():
            entry.sync()
            entry.save()
        super().sync()

    def snapshot(self):
        return {**super().snapshot(),
                "state_dicts": {name: entry.saved for name, entry in self._kept.items()}}

    def load_snapshot(self, snapshot):
        super().load_snapshot(snapshot)
        missing = set(self._kept) - set(snapshot["state_dicts"])
        if missing:
            raise ValueError(f"the saved state has no {', '.join(sorted(missing))}: it was "
                             f"written by another script (a state folder of another job?)")
        for name, entry in self._kept.items():
            entry.saved = snapshot["state_dicts"][name]

    def __setattr__(self, name, value):
        kept = self.__dict__.get("_kept", {})
        if name in kept:
            kept[name].value = value
            kept[name].save()
        super().__setattr__(name, value)
