"""The interface every algorithm implements, and the registries that find them.

An algorithm is one module holding one :class:`Algorithm` subclass decorated with
:func:`register`. Its ``collective`` (default ``"allreduce"``) says which registry of
``REGISTRIES`` it joins: ``ALGORITHMS`` is the allreduce one, and only it feeds the
allreduce driver, ``available()``, the command-line choices, the cost fit and ``auto``.
Every other collective (allgather, reduce-scatter, alltoall, broadcast, reduce) declares
its own interface, a subclass of :class:`Algorithm` decorated with :func:`interface`
(:mod:`.blocks`, beside its call), which opens its registry and carries its default
algorithm and its ``hpctrain bench`` plug-in (:class:`BenchPlugin`): a new collective
changes nothing here. An allreduce algorithm is discovered through ``ALGORITHMS`` by
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
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np

from .. import tags
from ..errors import UsageError
from .dtypes import choices

#: collective -> {name: algorithm}; each module registers its own with :func:`register`.
#: The allreduce's is always here; every other collective's opens when its interface is
#: declared (:func:`interface`), in the order of declaration.
REGISTRIES = {"allreduce": {}}
#: The allreduce algorithms by name.
ALGORITHMS = REGISTRIES["allreduce"]
#: collective -> its interface (:func:`interface`), for every collective but allreduce.
INTERFACES = {}
#: The allreduce algorithm where none is named, for ``hpctrain train`` and ``hpctrain.torch``
#: alike: the bandwidth-optimal ring, the algorithm Horovod runs over MPI, and always here
#: (Horovod itself is an optional extra).
DEFAULT_ALLREDUCE = "ring"
#: The environment variable that names it from the launch line, for both.
ENV_ALLREDUCE = "HPCTRAIN_ALLREDUCE"
#: The first tag handed out by :func:`register` (:mod:`hpctrain.tags`): user tags are never
#: seen on our private communicators, this only keeps each algorithm's messages apart.
FIRST_TAG = tags.FIRST_ALGORITHM_TAG
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
    registry = REGISTRIES.get(algorithm.collective)
    if registry is None:
        raise ValueError(f"{algorithm.collective!r} is not a collective: declare its "
                         f"interface with @interface before registering its algorithms")
    if algorithm.name in registry:
        raise ValueError(f"{algorithm.collective} algorithm {algorithm.name!r} registered "
                         f"twice")
    taken = [next(_FREE_TAGS) for _ in range(algorithm.tags)]
    algorithm.tag = taken[0]
    registry[algorithm.name] = algorithm
    return algorithm_class


def interface(interface_class):
    """Class decorator: declare ``interface_class``, a subclass of :class:`Algorithm` whose
    ``collective`` names a new collective, the interface its algorithms subclass. It opens
    the collective's registry in ``REGISTRIES`` and files the class in ``INTERFACES``, where
    ``companion`` finds its ``default`` and ``companions`` and ``hpctrain bench`` its
    ``bench`` plug-in.

    Declare it before its algorithms register, in the module that holds its call: the
    import of the first algorithm module then declares it.
    """
    collective = interface_class.collective
    if collective in REGISTRIES:
        raise ValueError(f"collective {collective!r} declared twice")
    if not interface_class.default:
        raise ValueError(f"the interface of {collective!r} names no default algorithm")
    REGISTRIES[collective] = {}
    INTERFACES[collective] = interface_class
    return interface_class


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
    #: Read on a collective's interface (:func:`interface`) only: the algorithm where none
    #: is named, the algorithm that goes with an allreduce algorithm where the names differ
    #: (``companion``), and the ``hpctrain bench`` plug-in (a :class:`BenchPlugin`).
    default = ""
    companions = {}
    bench = None

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


class BenchCommand(NamedTuple):
    """The command line of one collective's benchmark, ``hpctrain bench <collective>``."""

    moves: str                # what the collective moves, for the one-line help
    size: str                 # what ``size`` is and how busbw is counted
    buffers: str = "buffers"  # what each algorithm is timed on
    op: bool = False          # takes -o
    root: str = ""            # the help of -r/--root, where it takes one


@dataclass(frozen=True)
class BenchPlugin:
    """What ``hpctrain bench`` needs of one collective, everything that differs from one
    collective's benchmark to the next: an interface's ``bench``. The shared driver
    (``hpctrain.bench.driver``) does the rest.

    The functions take ``per`` (one block's elements; a collective whose vector is not cut
    into blocks: the whole vector's), the ``rank`` and the number of ranks ``p``:

    - ``sizes(per, p)``: the elements of ``(send, recv)``; ``recv`` ``None``: in place;
    - ``call(algo, send, recv, counts, args, comm)``: a call of no arguments (``counts``:
      ``per`` for each rank; ``args``: the parsed command line, ``args.op``, ``args.root``);
    - ``inputs(per, rank, p, data)``: this rank's ``send`` for the correctness pass, made
      with ``data`` (the driver's ``Exact``: ``data.blocks(per, seeds)``, integers in
      [-3, 3], a different vector per seed; ``data.zeros(count)``);
    - ``result(per, rank, p, args, data)``: what ``recv`` must then hold, exactly
      (``data.reduced(count, op)``: every rank's ``data.blocks(count, [rank])`` reduced).

    Its functions make their data through ``data``, so that declaring one imports no torch:
    the command line is built from the plug-ins before parsing.
    """

    command: BenchCommand
    sizes: Callable
    call: Callable
    inputs: Callable
    result: Callable
    bus_line: str             # "# busbw = ..." with {factor}, {ranks} and {root} to fill
    blocks: bool = True       # the vector is cut into p blocks (not broadcast, reduce)

    @property
    def reduces(self):
        """It takes an op (``-o``)."""
        return self.command.op

    @property
    def rooted(self):
        """It takes a root (``--root``)."""
        return bool(self.command.root)

    def parts(self, ranks):
        """How many equal parts ``count`` is cut into (``per`` elements each)."""
        return ranks if self.blocks else 1

    def bus_factor(self, ranks):
        """nccl-tests' busbw / algbw: (p-1)/p, the share of the vector each rank receives,
        where the vector is cut into blocks; 1 where the whole vector crosses a link."""
        return (ranks - 1) / ranks if self.blocks else 1.0


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
