"""The interface every algorithm implements, and what algorithms build with.

An algorithm is one module holding one :class:`Algorithm` subclass decorated with
:func:`~.registry.register`, which files it in its collective's registry (:mod:`.registry`).
An allreduce algorithm is discovered through ``ALGORITHMS`` by the driver, the mismatch
check, the cost model (:meth:`Algorithm.cost`), ``auto``, the command-line choices and the
tests (:meth:`Algorithm.examples`). A new algorithm defines

- :meth:`~Algorithm.schedule`: whom this rank exchanges which slice with, computed once
  per (count, options) and cached in a plan;
- :meth:`~Algorithm.run`: the data phase, reducing the flat transport array in place;
- optionally :meth:`~Algorithm.setup` / :meth:`~Algorithm.release`: per-communicator state
  such as sub-communicators, made once per private communicator and freed with it;
- optionally :meth:`~Algorithm.cost`: its time in the α-β-γ model (:mod:`.cost`).

An algorithm of another collective subclasses that collective's interface (an ``Algorithm``
declared with :func:`~.registry.interface` beside the collective's call) and defines its
``run``. The pieces algorithms share are here too: chunks and block layouts, placing a
rank's own block, waiting on requests, count options and the cost of a node-oblivious
algorithm.
"""

import os
from dataclasses import dataclass
from functools import partial

import numpy as np

from .. import units
from ..errors import UsageError
from .dtypes import choices


def place(dst, src):
    """``dst[...] = src`` for a rank's own block, before MPI moves it on.

    On the device the copy is a kernel queued on the stream, and a CUDA-aware MPI reads
    device memory without waiting for it: this waits (seen on an H100: without it the ring
    and butterfly allgathers sent blocks not yet written)."""
    dst[...] = src
    if getattr(dst, "is_cuda", False):
        import torch

        torch.cuda.current_stream(dst.device).synchronize()


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
            value, origin = units.number(text, int), env
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
    #: True for an algorithm that moves CUDA memory by its own means (Horovod): it gets
    #: device memory at every size, never staged by :func:`~.buffers.on_device`'s threshold.
    moves_device_memory = False
    #: Read on a collective's interface (:func:`~.registry.interface`) only: the algorithm
    #: where none is named, the algorithm that goes with an allreduce algorithm where the
    #: names differ (``companion``), and the ``hpctrain bench`` plug-in (a
    #: :class:`~.bench_plugin.BenchPlugin`).
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
