"""The interface every algorithm implements, and the registries that find them.

An algorithm is one module holding one :class:`Algorithm` subclass decorated with
:func:`register`. Its ``collective`` (default ``"allreduce"``) says which registry of
``REGISTRIES`` it joins: ``ALGORITHMS`` is the allreduce one, and only it feeds the
allreduce driver, ``available()``, the command-line choices, the cost fit and ``auto``;
the allgather, reduce-scatter, alltoall, broadcast and reduce algorithms (:mod:`.blocks`)
sit beside it in their own. An allreduce algorithm is discovered through ``ALGORITHMS`` by
the driver, the mismatch check, the cost model (:meth:`Algorithm.cost`), ``auto``, the
command-line choices and the tests (:meth:`Algorithm.examples`). A new algorithm defines

- :meth:`~Algorithm.schedule`: whom this rank exchanges which slice with, computed once
  per (count, options) and cached in a plan;
- :meth:`~Algorithm.run`: the data phase, reducing the flat transport array in place;
- optionally :meth:`~Algorithm.setup` / :meth:`~Algorithm.release`: per-communicator state
  such as sub-communicators, made once per private communicator and freed with it;
- optionally :meth:`~Algorithm.cost`: its time in the α-β-γ model (:mod:`.cost`).
"""

import itertools
import os
import zlib
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..errors import UsageError
from .dtypes import choices

#: The collectives the package implements, each with a registry of its algorithms.
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce")
#: collective -> {name: algorithm}; each module registers its own with :func:`register`.
REGISTRIES = {collective: {} for collective in COLLECTIVES}
#: The allreduce algorithms by name.
ALGORITHMS = REGISTRIES["allreduce"]
#: The allreduce algorithm where none is named, for ``hpctrain train`` and ``hpctrain.torch``
#: alike: the bandwidth-optimal ring, the algorithm Horovod runs over MPI, and always here
#: (Horovod itself is an optional extra).
DEFAULT_ALLREDUCE = "ring"
#: The environment variable that names it from the launch line, for both.
ENV_ALLREDUCE = "HPCTRAIN_ALLREDUCE"
#: The first tag handed out by :func:`register`; user tags are never seen on our private
#: communicator, this only keeps each algorithm's messages apart from the others'.
FIRST_TAG = 11
#: The tags not yet given to an algorithm, in order.
_FREE_TAGS = itertools.count(FIRST_TAG)


def place(dst, src):
    """``dst[...] = src`` for a rank's own block, before MPI moves it on.

    On the device the copy is a kernel queued on the stream, and a CUDA-aware MPI reads
    device memory without waiting for it: this waits (seen on an H100: without it the ring
    and butterfly allgathers sent blocks not yet written)."""
    dst[...] = src
    if getattr(dst, "is_cuda", False):
        import torch

        torch.cuda.current_stream(dst.device).synchronize()


def register(algorithm_class):
    """Class decorator: add one instance of an :class:`Algorithm` to the registry of its
    ``collective`` and give it ``tags`` message tags of its own (``algorithm.tag`` is the
    first), distinct from every other algorithm's, whatever its collective.

    Tags follow the order of registration, which the package's imports fix: the same on
    every rank.
    """
    algorithm = algorithm_class()
    registry = REGISTRIES[algorithm.collective]
    if algorithm.name in registry:
        raise ValueError(f"{algorithm.collective} algorithm {algorithm.name!r} registered "
                         f"twice")
    taken = [next(_FREE_TAGS) for _ in range(algorithm.tags)]
    algorithm.tag = taken[0]
    registry[algorithm.name] = algorithm
    return algorithm_class


def algorithm_code(name):
    """The number the mismatch check compares for an algorithm (the same on every rank)."""
    return zlib.crc32(name.encode())


def chunk_bounds(count, parts):
    """Offsets of ``parts`` contiguous chunks covering ``count`` elements (``parts + 1`` of them).

    Chunk sizes differ by at most one element: the first ``count % parts`` chunks get the
    extra one.
    """
    size, extra = divmod(count, parts)
    return tuple(i * size + min(i, extra) for i in range(parts + 1))


def waitall(requests):
    """Wait for every request of the list to complete."""
    from mpi4py import MPI

    MPI.Request.Waitall(requests)


def count_option(name, value, env, default, meaning):
    """The count option ``name`` (>= 0): ``value`` if the call gave one, else the integer in
    the environment variable ``env``, else ``default``. ``meaning`` says what would be right,
    for the messages of a bad value."""
    origin = f"allreduce option {name}"
    if value is None:
        text = os.environ.get(env)
        if text is None:
            return default
        try:
            value, origin = int(text), env
        except ValueError:
            raise UsageError(f"{env}={text!r} is not an integer: give {meaning}") from None
    if value < 0:
        raise UsageError(f"{origin}={value} must be >= 0: give {meaning}")
    return int(value)


def flat_cost(messages, sent, reduced, nodes):
    """The cost vector of a node-oblivious algorithm (see :mod:`.cost`): its messages and
    bytes go over the links between nodes when it spans several, else inside the node."""
    if nodes > 1:
        return (0.0, 0.0, float(reduced), float(messages), float(sent))
    return (float(messages), float(sent), float(reduced), 0.0, 0.0)


class Algorithm:
    """One allreduce algorithm. Subclasses set ``name`` and ``options`` and define
    :meth:`schedule` and :meth:`run`; the driver does everything else.

    ``run(comm, flat, plan)`` reduces the 1-D transport array ``flat`` in place over the
    private communicator ``comm``. It finds its schedule in ``plan.schedule``, its
    per-communicator state in ``plan.setup``, a receive workspace of
    ``plan.schedule.scratch`` elements in ``plan.scratch`` and the in-place reduction
    ``plan.reduce(dst, src)`` (``dst op= src``, both transport slices). It is called with the
    same schedule shape on every rank, so every send has a matching receive.
    """

    name = ""
    #: The collective it implements: its registry in ``REGISTRIES``.
    collective = "allreduce"
    #: Options the algorithm takes (``allreduce(..., root=1)``), name -> default. Every value
    #: is an integer; ``None`` stands for a default that depends on the number of ranks.
    options = {}
    #: How many message tags the algorithm uses; the registry sets ``tag``, the first.
    tags = 1
    tag = 0
    #: True if :meth:`setup` makes per-communicator state (a collective call).
    has_setup = False
    #: False for an algorithm whose predicted time is not one linear row of the model (the
    #: fit skips it; :meth:`predict` still answers).
    fitted = True
    #: True for an algorithm ``auto`` may choose from the model where nothing was measured.
    chosen_by_model = False
    #: False for an algorithm ``auto`` never chooses, even where it was measured fastest.
    chosen_by_auto = True

    def parameters(self, size, options):
        """The validated option values as a tuple of ints, in the order of ``options``."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            valid = choices(self.options) if self.options else "none"
            raise UsageError(f"allreduce algorithm {self.name!r} takes no option "
                             f"{unknown[0]!r}; its options: {valid}")
        values = {**self.options, **options}
        for key, value in values.items():
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, (int, np.integer))):
                raise UsageError(f"allreduce option {key}={value!r} must be an integer")
        return self.validate(size, tuple(values[key] for key in self.options))

    def validate(self, size, params):
        """Check option values against the number of ranks; resolve ``None`` defaults."""
        return params

    def describe(self, params):
        """The options as ``key=value`` text, for error messages."""
        return ", ".join(f"{k}={v}" for k, v in zip(self.options, params)) or "no options"

    def examples(self, size):
        """Option settings that together exercise every branch on ``size`` ranks (tests)."""
        return [{}]

    def setup(self, comm, params):
        """Per-communicator state for ``params`` (sub-communicators, a node map), made once
        per private communicator ``comm`` and handed to :meth:`schedule` and, as
        ``plan.setup``, to :meth:`run`. Synchronisation point when ``has_setup``: every rank
        calls it, in the data phase of the first call with these options."""
        return None

    def setup_key(self, params):
        """The options :meth:`setup` depends on (one set-up per distinct key)."""
        return params

    def communicators(self, state):
        """The communicators :meth:`setup` made into ``state`` (none by default)."""
        return ()

    def release(self, state):
        """Free what :meth:`setup` made (when the private communicator is freed)."""
        for comm in self.communicators(state):
            comm.Free()

    def schedule(self, size, rank, count, itemsize, params, setup=None):
        """Who this rank exchanges which slices with, for ``count`` elements of ``itemsize``
        bytes; the result must have a ``scratch`` attribute (receive workspace elements).
        The default suits algorithms that hand the buffer to a library: no workspace."""
        return NO_SCHEDULE

    def run(self, comm, flat, plan):
        """Reduce ``flat`` in place over ``comm`` (see the class docstring)."""
        raise NotImplementedError

    def bind(self, comm, plan):
        """``run(flat)``, the data phase including ``plan.finish``, with ``comm`` and
        ``plan`` bound. Override to pre-bind more where per-call overhead matters."""
        run, finish = self.run, plan.finish
        if finish is None:
            return lambda flat: run(comm, flat, plan)

        def run_and_finish(flat):
            run(comm, flat, plan)
            finish(flat)
        return run_and_finish

    def bind_buffer(self, comm, plan, flat, run):
        """``go()``: ``run(flat)`` with this buffer bound, for a buffer reduced again and
        again (the next call on the same array skips every lookup). Override to pre-bind
        what depends on the buffer itself."""
        return partial(run, flat)

    def averages(self, dtype):
        """True if :meth:`run` computes ``op="avg"`` itself for ``dtype``."""
        return False

    def device_capable(self, dtype, cuda_aware):
        """True if :meth:`run` may be handed CUDA device memory for ``dtype``."""
        return cuda_aware is True

    def cost(self, nbytes, ranks, nodes, params):
        """The α-β-γ cost vector of one allreduce of ``nbytes`` on ``ranks`` ranks spread
        over ``nodes`` nodes, with validated options ``params`` (see :mod:`.cost` for the
        five coefficients); ``None`` if the algorithm is not modelled."""
        return None

    @property
    def modelled(self):
        """True if the cost model predicts this algorithm (it defines a cost)."""
        cls = type(self)
        return cls.cost is not Algorithm.cost or cls.predict is not Algorithm.predict

    def predict(self, nbytes, ranks, nodes, params, machine):
        """Predicted seconds on ``machine`` (a :class:`.cost.Params`), or ``None``."""
        vector = self.cost(nbytes, ranks, nodes, params)
        return None if vector is None else machine.time(vector)


class AllgatherAlgorithm(Algorithm):
    """One allgather algorithm (registry ``REGISTRIES["allgather"]``).

    ``run(comm, send, recv, bounds)`` over the private communicator ``comm``: ``send`` and
    ``recv`` are flat ``uint8`` views (allgather moves bytes, whatever the dtype), in host
    memory or, where :meth:`device_capable` says so, on a CUDA device; rank ``r``'s block is
    ``send`` on rank ``r`` and lands at ``recv[bounds[r]:bounds[r + 1]]`` on every rank. It
    is called with the same ``bounds`` on every rank.
    """

    collective = "allgather"

    def run(self, comm, send, recv, bounds):
        """Gather every rank's ``send`` into ``recv`` (see the class docstring)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Reduction:
    """What a reduce-scatter or reduce algorithm reduces with: the element type, the op
    (``avg`` is already ``sum`` here: the caller divides), ``reduce(dst, src)`` (``dst op=
    src`` on transport slices) and a receive workspace of at least :meth:`workspace`
    elements."""

    dtype: object
    op: str
    reduce: object
    scratch: object


class ReduceScatterAlgorithm(Algorithm):
    """One reduce-scatter algorithm (registry ``REGISTRIES["reducescatter"]``).

    ``run(comm, send, recv, bounds, reduction)`` over the private communicator ``comm``:
    ``send`` is every rank's whole flat transport vector (``bounds[-1]`` elements, which the
    algorithm may overwrite); ``recv`` gets block ``rank``,
    ``send[bounds[rank]:bounds[rank + 1]]`` reduced over every rank with
    ``reduction.reduce``. It is called with the same ``bounds`` on every rank.
    """

    collective = "reducescatter"

    def workspace(self, size, rank, bounds):
        """Elements of receive workspace :meth:`run` needs (``reduction.scratch``)."""
        return 0

    def run(self, comm, send, recv, bounds, reduction):
        """Reduce ``send`` over every rank, this rank's block into ``recv``."""
        raise NotImplementedError


class AlltoallAlgorithm(Algorithm):
    """One alltoall algorithm (registry ``REGISTRIES["alltoall"]``).

    ``run(comm, send, send_bounds, recv, recv_bounds)`` over the private communicator
    ``comm``, on flat ``uint8`` views: ``send[send_bounds[j]:send_bounds[j + 1]]`` goes to
    rank ``j``, and what rank ``i`` sends this rank lands at
    ``recv[recv_bounds[i]:recv_bounds[i + 1]]``. The caller guarantees that the sizes of
    each pair's block agree on both ranks.
    """

    collective = "alltoall"

    def run(self, comm, send, send_bounds, recv, recv_bounds):
        """Send block ``j`` of ``send`` to rank ``j``; receive block ``i`` from rank ``i``."""
        raise NotImplementedError


class BroadcastAlgorithm(Algorithm):
    """One broadcast algorithm (registry ``REGISTRIES["broadcast"]``).

    ``run(comm, buf, root)`` over the private communicator ``comm``: ``buf`` is a flat
    ``uint8`` view of the same number of bytes on every rank (broadcast moves bytes,
    whatever the dtype, at least one); rank ``root``'s bytes land in every rank's ``buf``.
    """

    collective = "broadcast"

    def run(self, comm, buf, root):
        """Copy rank ``root``'s ``buf`` into every rank's ``buf``."""
        raise NotImplementedError


class ReduceAlgorithm(Algorithm):
    """One reduce algorithm (registry ``REGISTRIES["reduce"]``).

    ``run(comm, send, recv, root, reduction)`` over the private communicator ``comm``:
    ``send`` is every rank's flat transport vector, of one length on every rank (at least
    one element), which the algorithm may overwrite except on the root; on rank ``root``,
    ``recv`` (as long as ``send``, not overlapping it) gets ``send`` reduced over every
    rank with ``reduction.reduce``; on the other ranks ``recv`` is ``None``. It is called
    with the same length and ``root`` on every rank.
    """

    collective = "reduce"

    def workspace(self, size, rank, count, root):
        """Elements of receive workspace :meth:`run` needs (``reduction.scratch``)."""
        return 0

    def run(self, comm, send, recv, root, reduction):
        """Reduce every rank's ``send`` into the root's ``recv``."""
        raise NotImplementedError


def block_layout(bounds):
    """``(counts, displacements)`` of the blocks whose offsets are ``bounds``: the lists
    MPI's vector collectives (``Allgatherv``, ``Alltoallv``) take."""
    return ([hi - lo for lo, hi in zip(bounds, bounds[1:])], list(bounds[:-1]))


@dataclass(frozen=True)
class NoSchedule:
    """The schedule of an algorithm that needs none."""

    scratch: int = 0


NO_SCHEDULE = NoSchedule()


class RootedAlgorithm(Algorithm):
    """An algorithm with a ``root=`` option (default 0): a rank with a special role."""

    options = {"root": 0}

    def validate(self, size, params):
        root = params[0]
        if not 0 <= root < size:
            raise UsageError(f"allreduce option root={root} is not a rank: valid values are "
                             f"0 to {size - 1}")
        return (int(root),)

    def examples(self, size):
        """Every root."""
        return [{"root": r} for r in range(size)]
