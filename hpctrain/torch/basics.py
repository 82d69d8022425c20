"""The world (communicators, ranks, process sets, the engine), the backend every call goes
through, and the queries and shutdown; the bottom layer of the package, below the operations.

``init(comm=None, process_sets=None, allreduce=None)`` (in :mod:`.lifecycle`, above the
operations, which it wires to the world) is collective over ``comm`` (default
``COMM_WORLD``). The allreduce algorithm is, in order: the ``allreduce=`` argument, the
environment variable ``HPCTRAIN_ALLREDUCE``, else ``ring`` (as ``hpctrain train``: both take
``collectives.DEFAULT_ALLREDUCE``); the names are those of
``hpctrain.collectives.available()``, or ``auto`` (chosen per bucket size from the profile
given to ``hpctrain.collectives.auto.use``, or else loaded by ``init`` from
``$HPCTRAIN_ALLREDUCE_PROFILE``, default ``runs/study-allreduce/params.json``). The other
collectives use the algorithm of their own family that goes with it
(``hpctrain.collectives.companion``: ring with ring, butterfly with recursive doubling and
halving, ...).

The backend is chosen once, at ``init``, and kept as ``World.backend``
(:mod:`hpctrain.torch.backends`): hpctrain's own operations over its engine
(:mod:`hpctrain.torch.engine`, one communication thread that pairs operations across ranks by
name, as Horovod does), or, for ``horovod``, the real ``horovod.torch``, to which every call
of the package is handed.
"""

import atexit
import os
import threading

from .engine import Engine
from .process_sets import global_process_set
from .settings import Settings
from ..collectives.registry import DEFAULT_ALLREDUCE, ENV_ALLREDUCE
from ..devices import node_rank_and_size
from ..errors import ArgumentError
from ..log import set_rank as set_log_rank
from ..mpi import ulfm


_STATE = {}
#: Prefixes of names that count objects every rank makes alike (kept across a join).
OBJECT_NAMES = ("DistributedOptimizer", "process_set")


class World:
    """What ``init`` sets up: the communicators, the ranks, the algorithm, the process sets,
    the engine, and the ``backend`` that the public functions hand their calls to."""

    def __init__(self, comm, algo, backend, joined_allreduce, settings=None):
        # backend: an object of hpctrain.torch.backends; joined_allreduce(world) -> the
        # engine's handler for a joined rank's allreduce. Both given by init, which sits
        # above the operations (this module sits below them).
        self.settings = Settings() if settings is None else settings
        self.user_comm = comm
        self.comm = comm.Dup()              # the engine's negotiations
        self.data_comm = comm.Dup()         # the global set's collectives
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        set_log_rank(self.rank)             # its rank 0 is the one that logs
        self.local_rank, self.local_size = node_rank_and_size(comm)
        cross = comm.Split(self.local_rank, key=self.rank)
        self.cross_rank, self.cross_size = cross.Get_rank(), cross.Get_size()
        cross.Free()
        self.algo = algo
        self.backend = backend
        self._names = {}                    # (set id, prefix) -> next number
        self._names_lock = threading.Lock()
        self._generation = 0                # joins completed (see renumber)
        self._next_set = 1
        global_process_set._register(0, list(range(self.size)), self.data_comm, self.rank)
        global_process_set.mpi_comm = comm
        self.sets = {0: global_process_set}
        # Communicators that layers above duplicated from this world's (torch.distributed's
        # point-to-point ones): theirs to free, revoked with the world's after a death.
        self.duplicates = []
        self._engine = None
        self._engine_lock = threading.Lock()
        self._joined_allreduce = joined_allreduce
        if algo != "horovod":
            self._start_engine()

    @property
    def engine(self):
        """The communication thread, started at the first use.

        Under the ``horovod`` backend every operation goes to Horovod, whose own thread
        negotiates; an idle engine beside it would cost a cycle every millisecond, and its
        MPI polling makes Horovod's blocked thread spin (measured: 0.1-0.2 s of CPU in 5 idle
        seconds without it, 4.7 s with it). There the engine starts only for what Horovod
        does not do (``init_process_group``, ``comm_hook``): collectives that every rank
        makes, so every rank starts it, and the shutdown that ``close`` negotiates finds
        every rank's thread."""
        return self._engine if self._engine is not None else self._start_engine()

    def _start_engine(self):
        with self._engine_lock:
            if self._engine is None:
                self._engine = Engine(self.comm, self.sets,
                                      {"allreduce": self._joined_allreduce(self)},
                                      revoke=self.revoke, settings=self.settings)
        return self._engine

    def next_name(self, set_id, prefix="noname"):
        """The name of this rank's next unnamed operation of set ``set_id``: the same on
        every rank that makes its calls in the same order."""
        with self._names_lock:
            number = self._names.get((set_id, prefix), 0)
            self._names[(set_id, prefix)] = number + 1
            if self._generation and prefix not in OBJECT_NAMES:
                return f"{prefix}.{self._generation}.{number}"
        return f"{prefix}.{number}"

    def renumber(self):
        """After a ``join``, on every rank: count unnamed operations afresh. Ranks that ran
        different numbers of steps before joining (the reason to join) made different
        numbers of unnamed calls (backward's allreduces, say); without this, their next
        unnamed calls would never pair up. Objects (optimizers, process sets) keep their
        numbers: those were made by every rank alike."""
        with self._names_lock:
            self._names = {key: n for key, n in self._names.items() if key[1] in OBJECT_NAMES}
            self._generation += 1

    def algorithm_for(self, collective):
        """The algorithm of ``collective`` that goes with this world's allreduce."""
        from .. import collectives

        return collectives.companion(collective, self.algo)

    def resolve_ranks(self, pset):
        """The world ranks of ``pset`` (translating a communicator's group)."""
        if pset.ranks is not None:
            bad = [r for r in pset.ranks if not 0 <= r < self.size]
            if bad or not pset.ranks:
                raise ArgumentError(f"a process set needs ranks from 0 to {self.size - 1}, "
                                    f"got {pset.ranks}: e.g. hvd.ProcessSet([0, 1])")
            return pset.ranks
        group = pset.mpi_comm.Get_group()
        ranks = group.Translate_ranks(list(range(group.Get_size())),
                                      self.user_comm.Get_group())
        if any(r < 0 for r in ranks):
            raise ArgumentError(f"a process set's communicator has {group.Get_size()} ranks, "
                                f"some outside the world of hvd.init: make it from that "
                                f"world (e.g. COMM_WORLD.Split(color))")
        return sorted(ranks)

    def register_set(self, pset, ranks, distinct=True):
        """On the communication thread, on every rank: number ``pset`` and make its
        communicator (``Split`` of the world: a collective of every rank). ``distinct``:
        ``ValueError`` where a set of the same ranks exists (Horovod's rule; a
        ``torch.distributed`` group of the same ranks is another group)."""
        from mpi4py import MPI

        for other in self.sets.values() if distinct else ():
            if other.ranks == list(ranks):
                raise ValueError(f"a process set with ranks {list(ranks)} exists already: "
                                 f"{other}")
        member = self.rank in ranks
        comm = self.comm.Split(0 if member else MPI.UNDEFINED, key=self.rank)
        set_id, self._next_set = self._next_set, self._next_set + 1
        pset._register(set_id, list(ranks), comm if member else None, self.rank)
        self.sets[set_id] = pset
        return pset

    def unregister_set(self, set_id):
        """On the communication thread: forget set ``set_id`` and free its communicator."""
        pset = self.sets.pop(set_id)
        if pset.comm is not None:
            pset.comm.Free()            # frees the collectives' context of it too
        pset._forget()
        return True

    def communicators(self):
        """Every communicator of this world on which messages move: the user's, the
        engine's, the sets', the ``duplicates`` of the layers above, and the private ones
        of the collectives over them."""
        from ..collectives import contexts

        comms = [self.user_comm, self.comm, self.data_comm, *self.duplicates,
                 *(s.comm for s in self.sets.values() if s.comm is not None)]
        for comm in list(comms):
            ctx = contexts.existing(comm)
            if ctx is not None:
                comms += ctx.communicators()
        return comms

    def revoke(self):
        """After a rank died (MPI with fault tolerance): revoke every communicator of the
        world, so that every survivor's operation on any of them fails at once, instead of
        waiting for a rank that has died or has gone on to the recovery. Any rank may call
        it, any number of times."""
        for comm in self.communicators():
            ulfm.revoke(comm)

    def close(self, wait=True):
        """Stop the engine (if started) on every rank and free the communicators."""
        if self._engine is not None:
            self._engine.close(wait)
        if wait:
            for set_id in [s for s in self.sets if s]:
                self.unregister_set(set_id)
            global_process_set._forget()
            self.data_comm.Free()
            self.comm.Free()


def choose_algorithm(allreduce, hierarchical=False):
    """The algorithm name to use: the argument, ``$HPCTRAIN_ALLREDUCE``, ``hierarchical``
    if ``hierarchical`` (Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE=1``), else ``ring``.

    Raises ``ValueError`` naming the valid choices for an unknown name (the same on every
    rank: every rank reads the same argument or environment).
    """
    from .. import collectives

    source = "allreduce="
    if allreduce is None:
        allreduce, source = os.environ.get(ENV_ALLREDUCE) or None, f"{ENV_ALLREDUCE}="
    if allreduce is None:
        return "hierarchical" if hierarchical else DEFAULT_ALLREDUCE
    # "auto" picks one of the others per message size (collectives.auto.use gives it a profile).
    names = collectives.available() + ["auto"]
    if allreduce not in names:
        known = sorted(collectives.ALGORITHMS)
        why = (" (Horovod is not installed here)" if allreduce in known else "")
        raise ValueError(f"{source}{allreduce!r} is not an allreduce algorithm here{why}; "
                         f"choose one of: {', '.join(names)}")
    return allreduce


def adopt(started):
    """Make ``started`` (a :class:`World`) the world every call uses, and shut it down at
    exit, so that a rank that finishes early never leaves the others waiting. Called by
    :func:`hpctrain.torch.lifecycle.init`."""
    _STATE["world"] = started
    if not _STATE.get("atexit"):
        _STATE["atexit"] = atexit.register(shutdown)


def world():
    """The started world; ``ValueError`` (as Horovod raises) before ``init``."""
    started = _STATE.get("world")
    if started is None:
        raise ValueError("hpctrain.torch has not been initialized; use hvd.init() first")
    return started


def is_initialized():
    """True between ``init`` and ``shutdown``."""
    return "world" in _STATE


def shutdown():
    """Stop the communication thread on every rank and free the communicators; ``init``
    may follow again. Operations other ranks are still waiting for fail there."""
    started = _STATE.pop("world", None)
    if started is not None:
        started.backend.shutdown()
        started.close()


def abandon():
    """After a failure: forget the world without waiting for its thread, which may be
    blocked in a negotiation that other ranks will never join (the job is ending, or every
    rank failed together and may ``init`` again)."""
    started = _STATE.pop("world", None)
    if started is not None:
        started.close(wait=False)
        started.backend.shutdown()


def rank():
    """This process's rank in the communicator given to ``init``."""
    return world().rank


def size():
    """The number of ranks."""
    return world().size


def local_rank():
    """This rank's index among the ranks on its node."""
    return world().local_rank


def local_size():
    """The number of ranks on this rank's node."""
    return world().local_size


def cross_rank():
    """The index of this rank's node among the nodes (ranks of equal local rank)."""
    return world().cross_rank


def cross_size():
    """The number of ranks that share this rank's local rank (the nodes, when even)."""
    return world().cross_size


def algorithm():
    """The name of the allreduce algorithm in use."""
    return world().algo


def mpi_built():
    """True: hpctrain runs on MPI."""
    return True


def gloo_built():
    """False: hpctrain has no Gloo controller."""
    return False


def nccl_built():
    """False: hpctrain reduces CUDA tensors through MPI (CUDA-aware or staged), not NCCL."""
    return False


def cuda_built():
    """True when this torch build has CUDA (hpctrain then reduces CUDA tensors)."""
    import torch

    return torch.backends.cuda.is_built()


def mpi_threads_supported():
    """True when MPI runs with ``MPI_THREAD_MULTIPLE``."""
    from mpi4py import MPI

    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_enabled():
    """True: every operation runs over MPI."""
    return True


def gloo_enabled():
    """False: hpctrain has no Gloo controller."""
    return False


def ccl_built():
    """False: no oneCCL."""
    return False


def ddl_built():
    """False: no IBM DDL."""
    return False


def rocm_built():
    """False: no ROCm build."""
    return False


def is_homogeneous():
    """True when every node runs the same number of ranks."""
    w = world()
    return w.size % w.local_size == 0 and w.cross_size * w.local_size == w.size
