"""The collectives ``hpctrain bench`` times beside allreduce, one plug-in each, as
nccl-tests times these collectives: allgather, reducescatter, alltoall, broadcast, reduce.

A plug-in (:class:`~hpctrain.collectives.algorithm.BenchPlugin`) is everything that differs
from one collective's benchmark to the next: its command line, its buffers, its call, its
correctness input and exact result, its busbw line. Each collective declares its own on
its interface (``bench``, beside its call in :mod:`hpctrain.collectives.blocks`), and
:data:`PLUGINS` reads them from ``collectives.INTERFACES``: a new collective brings its
benchmark with it, and nothing in ``bench`` changes. The driver (:mod:`.driver`) runs any
of them on the allreduce benchmark's pieces: the same ``#`` header, timing loop (warm-up,
algorithms taking turns in rotated rounds, :func:`.allreduce.time_calls`), columns,
correctness pass, footer and JSON/HDF5 outputs.

This module imports no torch: the command line (``cli``) is built from :data:`PLUGINS`
before parsing, and the plug-ins make their data through the object the driver hands them
(:class:`.driver.Exact`).
"""

from collections.abc import Mapping

from ..collectives.algorithm import INTERFACES

class Plugins(Mapping):
    """collective -> its plug-in, for every interface that declares one, in the order the
    interfaces were declared (the help's order). Read at each use, so a collective declared
    after this module was imported has its benchmark too."""

    def __getitem__(self, collective):
        plugin = INTERFACES[collective].bench
        if plugin is None:
            raise KeyError(collective)
        return plugin

    def __iter__(self):
        return (name for name, declared in INTERFACES.items() if declared.bench is not None)

    def __len__(self):
        return sum(1 for _ in self)


#: The collectives ``bench`` times beside allreduce, by their command and REGISTRIES name.
PLUGINS = Plugins()
