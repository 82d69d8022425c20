"""What one collective's benchmark does beyond the shared driver (:mod:`.driver`): the hooks
a plug-in's ``extras`` class may override, each doing nothing here. Only allreduce's
benchmark has any (:class:`.allreduce.AllreduceExtras`: ``auto`` and its profile, the
Sendrecv reference).

The driver makes one object per run and calls its hooks on every rank, in the order they
are defined here. Imports no torch: the command line is built before it is needed.
"""

from .. import collectives
from ..errors import UsageError


class Extras:
    """The hooks of a benchmark, with nothing to add."""

    def algorithms(self, collective, args):
        """The algorithms ``--algos`` names, in order (by default every available one),
        after checking them (local: no communication)."""
        valid = collectives.available(collective)
        return chosen(collective, args.algos, valid, valid)

    def settings(self, args, comm, device):
        """More ``{name: value}`` for the header's settings and the outputs' (collective
        where a subclass says so)."""
        return {}

    def begin(self, args, comm):
        """Called after the header, before the first timed call."""

    def beside(self, buf, comm, first):
        """Calls of no arguments (name -> call) to time beside the algorithms on ``buf``, the
        timed buffer (on ``comm``); ``first``: at the smallest size, in the group timed
        before Horovod."""
        return {}

    def measured(self, name, row):
        """The table row (not printed) of the call ``name`` of :meth:`beside`."""

    def closing(self, rows, ranks):
        """``(lines before the footer, lines after it)``, given every printed row."""
        return [], []

    def document(self):
        """More keys of the JSON document."""
        return {}


def chosen(collective, algos, valid, default):
    """The algorithms of ``collective`` named by ``algos`` (``--algos``, comma-separated;
    ``default`` where empty); a name not in ``valid`` is a ``UsageError``."""
    names = algos.split(",") if algos else list(default)
    unknown = [name for name in names if name not in valid]
    if unknown:
        raise UsageError(f"unknown {collective} algorithm(s) {', '.join(unknown)} in "
                         f"--algos; valid: {', '.join(valid)}")
    return names
