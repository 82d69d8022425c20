"""Fault injection, so that tests can prove a failing rank never leaves the job hanging.

Set ``HPCTRAIN_FAULT`` to a comma-separated list of ``POINT@RANK`` (``RANK`` may be ``*``);
when the rank reaches that named point of a subcommand, it raises ``InjectedFault``. For
example ``HPCTRAIN_FAULT=info.gather@2 mpirun -np 3 python -m hpctrain info`` makes rank 2
fail while rank 0 waits for it in a gather. Unset, ``inject`` costs one dictionary lookup.
"""

import os

ENV = "HPCTRAIN_FAULT"


class InjectedFault(RuntimeError):
    """The failure that ``HPCTRAIN_FAULT`` asked for."""


def inject(point, rank):
    """Raise ``InjectedFault`` if ``HPCTRAIN_FAULT`` names ``point`` for ``rank``."""
    spec = os.environ.get(ENV)
    if spec and _selected(spec, point, rank):
        raise InjectedFault(f"injected fault at {point!r} on rank {rank} ({ENV}={spec})")


def _selected(spec, point, rank):
    for item in spec.split(","):
        name, _, ranks = item.strip().partition("@")
        if name == point and ranks in ("*", str(rank)):
            return True
    return False
