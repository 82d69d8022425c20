"""Errors that hpctrain reports as a message rather than a traceback."""


class UsageError(Exception):
    """Bad input from the user: the message says what was wrong and what would be right.

    Under ``python -m hpctrain`` it is printed without a traceback and the job exits with
    status 2. Found by one rank alone it ends the job (``MPI_Abort``); found by the start-up
    checks, which every rank runs, it becomes a :class:`Verdict`.
    """

    exit_code = 2


class Verdict(UsageError):
    """Bad input that every rank knows of, the same on every rank: the problems each rank
    found, agreed by one collective (:func:`hpctrain.runtime.agree`).

    ``problems``: ``[(message, ranks), ...]``, each distinct message once with the ranks that
    found it; ``size`` and ``rank``: the agreeing communicator's. Its rank 0 prints each
    problem once; every rank exits with status 2 normally (``MPI_Finalize``): nobody is left
    waiting, so nothing needs ``MPI_Abort``.
    """

    def __init__(self, problems, size, rank):
        self.problems = [(message, list(ranks)) for message, ranks in problems]
        self.size, self.rank = size, rank
        super().__init__("\n".join(self.lines()))

    @classmethod
    def everywhere(cls, message, comm):
        """The verdict for a problem that every rank of ``comm`` found (from one collective
        that told them all)."""
        return cls([(message, range(comm.Get_size()))], comm.Get_size(), comm.Get_rank())

    def line(self):
        """Every problem on one line, ``; ``-separated (for a footnote)."""
        return "; ".join(self.lines())

    def lines(self):
        """One line per problem, naming its ranks when not all of them found it."""
        for message, ranks in self.problems:
            if len(ranks) == self.size:
                yield message
            else:
                which = ", ".join(map(str, ranks))
                yield f"{message} (rank{'s' if len(ranks) > 1 else ''} {which} of {self.size})"


class ArgumentError(UsageError, ValueError):
    """A bad argument to an API whose callers expect ``ValueError`` (Horovod's raises it):
    caught as one, and reported like any :class:`UsageError` when nobody catches it."""
