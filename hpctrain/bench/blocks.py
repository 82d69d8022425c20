"""The collectives ``hpctrain bench`` times, one plug-in each, as nccl-tests times them:
allreduce, allgather, reducescatter, alltoall, broadcast, reduce.

A plug-in (:class:`~hpctrain.collectives.bench_plugin.BenchPlugin`) is everything that
differs from one collective's benchmark to the next: its command line, its buffers, its
call, its correctness input and exact result, its busbw line, and what it does beyond the
driver (its ``extras``). Each collective but allreduce declares its own on its interface
(``bench``, beside its call in its module, ``hpctrain.collectives.allgather_call``, ...),
and :data:`PLUGINS` reads them from ``collectives.registry.INTERFACES``: a new collective
brings its benchmark with it, and nothing in ``bench`` changes. Allreduce's interface is the
base of all the others, so its plug-in is declared in :mod:`.allreduce` and listed first.
The one driver (:mod:`.driver`) runs any of them: the same ``#`` header, timing loop
(warm-up, algorithms taking turns in rotated rounds, :func:`.driver.time_calls`), columns,
correctness pass, footer and JSON/HDF5 outputs.

This module imports no torch: the command line (``cli``) is built from :data:`PLUGINS`
before parsing, and the plug-ins make their data through the object the driver hands them
(:class:`.driver.Exact`).
"""

from collections.abc import Mapping

from ..collectives.registry import INTERFACES
from . import allreduce

#: The collective whose plug-in is declared in :mod:`.allreduce`.
ALLREDUCE = "allreduce"


class Plugins(Mapping):
    """collective -> its plug-in: allreduce's, then every interface's that declares one, in
    the order the interfaces were declared (the help's order). Read at each use, so a
    collective declared after this module was imported has its benchmark too."""

    def __getitem__(self, collective):
        if collective == ALLREDUCE:
            return allreduce.PLUGIN
        plugin = INTERFACES[collective].bench
        if plugin is None:
            raise KeyError(collective)
        return plugin

    def __iter__(self):
        yield ALLREDUCE
        yield from (name for name, declared in INTERFACES.items()
                    if declared.bench is not None)

    def __len__(self):
        return sum(1 for _ in self)


#: The collectives ``bench`` times, by their command and REGISTRIES name.
PLUGINS = Plugins()
