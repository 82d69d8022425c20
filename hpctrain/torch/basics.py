"""Start-up, the world, and the one communication thread every operation goes through.

``init(comm=None, allreduce=None)`` is collective over ``comm`` (default ``COMM_WORLD``).
The allreduce algorithm is, in order: the ``allreduce=`` argument, the environment variable
``HPCTRAIN_ALLREDUCE``, else ``ring``; the names are those of
``hpctrain.collectives.available()``, or ``auto`` (chosen per bucket size from the profile
given to ``hpctrain.collectives.auto.use``). With ``horovod`` every operation is handed to the real
``horovod.torch``.

Every collective of this package runs on one background thread, in the order the calls were
made (a FIFO queue), on a private duplicate of ``comm``: so one rank's collectives can never
be matched with the user's own messages, and the main thread never calls MPI while the
thread does (``MPI_THREAD_SERIALIZED`` is enough). Horovod matches operations by name, so
its ranks may issue them in any order; here every rank must issue them in the same order,
and a mismatch of name, shape or dtype is detected and raised on every rank.
"""

import os
import queue
import threading

from ..runtime import guard

ENV_ALLREDUCE = "HPCTRAIN_ALLREDUCE"
DEFAULT_ALLREDUCE = "ring"

_STATE = {}


class World:
    """What ``init`` sets up: the communicators, the ranks and the algorithm."""

    def __init__(self, comm, algo):
        from mpi4py import MPI

        self.user_comm = comm
        self.comm = comm.Dup()
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        cross = comm.Split(self.local_rank, key=self.rank)
        self.cross_rank, self.cross_size = cross.Get_rank(), cross.Get_size()
        local.Free()
        cross.Free()
        self.algo = algo
        self.engine = Engine()
        self.hvd = None
        self.pending_names = set()   # names of queued operations not yet synchronised

    def close(self):
        """Stop the thread and free the communicator (collective)."""
        self.engine.close()
        self.comm.Free()


def choose_algorithm(allreduce):
    """The algorithm name to use: the argument, ``$HPCTRAIN_ALLREDUCE`` or ``ring``.

    Raises ``ValueError`` naming the valid choices for an unknown name (the same on every
    rank: every rank reads the same argument or environment).
    """
    from .. import collectives

    source = "allreduce="
    if allreduce is None:
        allreduce, source = os.environ.get(ENV_ALLREDUCE) or None, f"{ENV_ALLREDUCE}="
    if allreduce is None:
        return DEFAULT_ALLREDUCE
    # "auto" picks one of the others per message size (collectives.auto.use gives it a profile).
    names = collectives.available() + ["auto"]
    if allreduce not in names:
        known = sorted(collectives.ALGORITHMS)
        why = (" (Horovod is not installed here)" if allreduce in known else "")
        raise ValueError(f"{source}{allreduce!r} is not an allreduce algorithm here{why}; "
                         f"choose one of: {', '.join(names)}")
    return allreduce


def init(comm=None, allreduce=None):
    """Start hpctrain.torch over ``comm`` (an mpi4py communicator, default ``COMM_WORLD``).

    Synchronisation point: collective over ``comm``. A second call does nothing (as in
    Horovod). ``allreduce`` picks the algorithm; see the module docstring.

    It also installs the guard of ``python -m hpctrain`` (:func:`hpctrain.runtime.guard`): an
    exception that no code catches, on any rank, prints that rank's traceback and ends every
    rank (``MPI_Abort``), where Horovod would leave the others waiting in their next
    collective. ``HPCTRAIN_ABORT_ON_ERROR=0`` leaves ``sys.excepthook`` as it was.
    """
    if _STATE:
        return
    guard()
    algo = choose_algorithm(allreduce)
    from mpi4py import MPI

    if isinstance(comm, (list, tuple)):
        raise NotImplementedError("init(comm=[ranks]) (a subset of ranks) is not supported: "
                                  "pass an mpi4py communicator made with Comm.Split")
    world = World(MPI.COMM_WORLD if comm is None else comm, algo)
    if algo == "horovod":
        import horovod.torch as hvd

        hvd.init(comm=world.user_comm)
        world.hvd = hvd
    _STATE["world"] = world


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
    """Stop the communication thread and free the communicator; ``init`` may follow again."""
    started = _STATE.pop("world", None)
    if started is not None:
        if started.hvd is not None:
            started.hvd.shutdown()
        started.close()


def abandon():
    """After a failure: forget the world without waiting for its thread, which may be
    blocked in a collective that other ranks will never join (the job is ending, or every
    rank failed together and may ``init`` again)."""
    started = _STATE.pop("world", None)
    if started is not None:
        started.engine.close(wait=False)
        if started.hvd is not None:
            started.hvd.shutdown()


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


class Handle:
    """One queued operation: ``wait()`` returns its result or raises its error."""

    __slots__ = ("run", "result", "error", "done", "name", "event")

    def __init__(self, run, name=None):
        self.run, self.name = run, name
        self.result = self.error = self.event = None
        self.done = threading.Event()

    def wait(self):
        """Block until the operation has run; return its result or raise its error."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class Engine:
    """One thread that runs queued operations in submission order."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="hpctrain-comm", daemon=True)
        self._thread.start()

    def submit(self, run, name=None):
        """Queue ``run()``; return its :class:`Handle`."""
        handle = Handle(run, name)
        self._queue.put(handle)
        return handle

    @staticmethod
    def run_here(run, name=None):
        """Run ``run()`` on the calling thread now; return its finished :class:`Handle`.

        Only where no other rank takes part (one rank), so that order cannot matter: it
        saves the hand-over to the thread, which costs more than the work there.
        """
        handle = Handle(run, name)
        try:
            handle.result = run()
        except BaseException as exc:  # noqa: B036 - re-raised by wait(), as from the thread
            handle.error = exc
        handle.done.set()
        return handle

    def _serve(self):
        while True:
            handle = self._queue.get()
            if handle is None:
                return
            try:
                handle.result = handle.run()
            except BaseException as exc:  # noqa: B036 - re-raised by wait() on the caller
                # The caller would otherwise wait for ever on an operation that failed here.
                handle.error = exc
            finally:
                handle.done.set()

    def close(self, wait=True):
        """Stop the thread after what is queued (``wait=False``: do not join it)."""
        self._queue.put(None)
        if wait:
            self._thread.join()
