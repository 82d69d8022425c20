"""The registries that find the algorithms by name, one per collective.

An algorithm module holds one :class:`~.algorithm.Algorithm` subclass decorated with
:func:`register`. Its ``collective`` (default ``"allreduce"``) says which registry of
``REGISTRIES`` it joins: ``ALGORITHMS`` is the allreduce one, and only it feeds the
allreduce driver, ``available()``, the command-line choices, the cost fit and ``auto``.
Every other collective declares its own interface, a subclass of ``Algorithm`` decorated
with :func:`interface` (in its own module, ``allgather_call.py``, ..., beside its call),
which opens its registry and carries its default algorithm and its ``hpctrain bench``
plug-in (:class:`~.bench_plugin.BenchPlugin`): a new collective changes nothing here.
"""

import itertools

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


def register(algorithm_class):
    """Class decorator: add one instance of an :class:`~.algorithm.Algorithm` to the
    registry of its ``collective`` and give it ``tags`` message tags of its own
    (``algorithm.tag`` is the first), distinct from every other algorithm's, whatever its
    collective.

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
    """Class decorator: declare ``interface_class``, a subclass of
    :class:`~.algorithm.Algorithm` whose ``collective`` names a new collective, the
    interface its algorithms subclass. It opens the collective's registry in ``REGISTRIES``
    and files the class in ``INTERFACES``, where :func:`companion` finds its ``default`` and
    ``companions`` and ``hpctrain bench`` its ``bench`` plug-in.

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


def lookup(collective, algo):
    """The registered ``collective`` algorithm named ``algo``; a ``UsageError`` naming the
    valid ones otherwise."""
    found = REGISTRIES[collective].get(algo)
    if found is None:
        raise UsageError(f"unknown {collective} algorithm {algo!r}; valid choices: "
                         f"{choices(REGISTRIES[collective])}")
    return found


def companion(collective, allreduce_algo):
    """The algorithm of ``collective`` (``allgather``, ``reducescatter``, ``alltoall``,
    ``broadcast``, ``reduce`` or any other declared with ``@interface``) that goes with the
    allreduce algorithm ``allreduce_algo``: the one its interface's ``companions`` names,
    else the one of the same name where there is one (``ring``, ``butterfly``, ``mpi``;
    broadcast: ``tree``, ``mpi``, and ``scatter_allgather`` for ``ring`` and ``butterfly``;
    reduce: ``tree``, ``mpi``), else the interface's ``default`` (``ring``; ``pairwise`` for
    alltoall; ``tree`` for broadcast and reduce) — for ``ps``, ``ps-sharded``,
    ``hierarchical``, ``horovod``, ``auto`` and any other name."""
    declared = INTERFACES.get(collective)
    if declared is None:
        raise UsageError(f"companion: unknown collective {collective!r}; valid choices: "
                         f"{choices(INTERFACES)}")
    name = declared.companions.get(allreduce_algo, allreduce_algo)
    return name if name in REGISTRIES[collective] else declared.default
