"""Fault injection, so that tests can prove a failing rank never leaves the job hanging.

Set ``HPCTRAIN_FAULT`` to a comma-separated list of ``POINT@RANK`` (``RANK`` may be ``*``);
when the rank reaches that named point of a subcommand, it raises ``InjectedFault``. For
example ``HPCTRAIN_FAULT=info.gather@2 mpirun -np 3 python -m hpctrain info`` makes rank 2
fail while rank 0 waits for it in a gather. Points that do not raise but misbehave (such as
``bench.corrupt``, which spoils one result element) ask ``selected``. Unset, either costs one
dictionary lookup.
"""

import os

ENV = "HPCTRAIN_FAULT"


class InjectedFault(RuntimeError):
    """The failure that ``HPCTRAIN_FAULT`` asked for."""


def inject(point, rank):
    """Raise ``InjectedFault`` if ``HPCTRAIN_FAULT`` names ``point`` for ``rank``."""
    if selected(point, rank):
        raise InjectedFault(f"injected fault at {point!r} on rank {rank} "
                            f"({ENV}={os.environ[ENV]})")


def selected(point, rank):
    """True if ``HPCTRAIN_FAULT`` names ``point`` for ``rank``."""
    spec = os.environ.get(ENV)
    if not spec:
        return False
    for item in spec.split(","):
        name, _, ranks = item.strip().partition("@")
        if name == point and ranks in ("*", str(rank)):
            return True
    return False
