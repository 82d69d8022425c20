"""Process sets: collectives among a subset of the ranks, as Horovod's ``ProcessSet``.

    evens = hvd.add_process_set([0, 2])          # every rank calls it (a collective)
    if evens.included():
        hvd.allreduce(t, process_set=evens)      # only ranks 0 and 2 take part

A set is a sub-communicator of the world's private communicator, made on the communication
thread when every rank has asked for it (so every rank numbers the sets alike: the global
set is 0, then 1, 2, ... in the order they were added). Sets can also be given to ``init``
(``init(process_sets=[hvd.ProcessSet([0, 1]), ...])``), and removed again with
:func:`remove_process_set`. An operation on a set is paired by name among that set's ranks
only; a rank outside the set that asks for it gets a ``ValueError`` at once.
"""


class ProcessSet:
    """A set of world ranks that runs collectives among themselves.

    ``ranks``: the world ranks (any order; kept sorted), or an mpi4py communicator whose
    ranks in ``COMM_WORLD`` make the set. It takes effect once registered, by ``init`` or
    :func:`add_process_set`; ``process_set_id`` is then its number.
    """

    def __init__(self, ranks_or_comm):
        self.process_set_id = None
        self.comm = None                    # this rank's communicator of the set, if included
        self._rank = None                   # this process's world rank, once registered
        self.lost = None                    # why it is gone, after a shrink took a rank
        if hasattr(ranks_or_comm, "Get_group"):
            self.mpi_comm = ranks_or_comm
            self.ranks = None               # known once registered (translated then)
        else:
            self.mpi_comm = None
            self.ranks = _ranks(ranks_or_comm)

    def _register(self, set_id, ranks, comm, my_rank):
        self.process_set_id, self.ranks, self.comm, self._rank = set_id, ranks, comm, my_rank

    def _forget(self):
        self.process_set_id, self.comm = None, None

    def size(self):
        """The number of ranks in the set (``None`` before it is registered)."""
        return None if self.ranks is None else len(self.ranks)

    def rank(self):
        """This process's rank within the set (``None`` if not included or not registered)."""
        if self.ranks is None or self._rank not in self.ranks:
            return None
        return self.ranks.index(self._rank)

    def included(self):
        """True if this process is one of the set's ranks (``None`` before registration)."""
        if self.process_set_id is None:
            return None
        return self._rank in self.ranks

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.ranks == other.ranks

    __hash__ = object.__hash__

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


def _ranks(ranks):
    """Sorted distinct ints; ``ValueError`` naming the bad value otherwise."""
    try:
        values = [int(r) for r in ranks]
    except (TypeError, ValueError):
        raise ValueError(f"a process set takes a list of integer ranks or an mpi4py "
                         f"communicator, got {ranks!r}") from None
    if len(set(values)) != len(values):
        raise ValueError(f"a process set's ranks must be distinct, got {values}")
    return sorted(values)


#: The set of every rank (id 0). Its ranks are filled in by ``init``.
global_process_set = ProcessSet([])
