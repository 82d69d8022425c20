"""Errors that hpctrain reports as a message rather than a traceback."""


class UsageError(Exception):
    """Bad input from the user: the message says what was wrong and what would be right.

    Under ``python -m hpctrain`` it is printed without a traceback and the job exits with
    status 2 on every rank.
    """

    exit_code = 2
