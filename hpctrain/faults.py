"""Fault injection, so that tests can prove a failing rank never leaves the job hanging.

Set ``HPCTRAIN_FAULT`` to a comma-separated list of ``POINT@RANK[#N][/START][:ACTION]``
items (``RANK`` may be ``*``). When the rank reaches that named point of a subcommand (the
``N``-th time it does, if ``#N`` is given; every time otherwise; only in the ``START``-th
start of an elastic job, counted from 0 by ``HPCTRAIN_ELASTIC_RESTART``, if ``/START`` is
given), the action happens:

- ``raise`` (the default): raise ``InjectedFault``;
- ``kill``: the process kills itself with ``SIGKILL`` (no traceback, no clean-up);
- ``kill-host``: the process sends ``SIGKILL`` to the other processes its launcher started
  on this host (its parent's other children: the host's other ranks, under ``mpirun``'s
  daemon or ``srun``'s step) and then to itself, all at one moment, as losing the host does;
  ranks that each ``kill`` themselves at the same step die a scheduler's whim apart, and the
  others may see them go one at a time;
- ``sleep=SECONDS``: the rank stops for that long, then goes on (a stalled rank);
- any other word (``nan``, ``inf``, ``perturb``): ``inject`` returns it, and the point's
  code misbehaves as that point documents.

For example ``HPCTRAIN_FAULT=info.gather@2 mpirun -np 3 python -m hpctrain info`` makes rank
2 fail while rank 0 waits for it in a gather, and ``train.step@1#5:kill`` kills rank 1 after
its fifth training step. Points that only misbehave (such as ``bench.corrupt``) may also ask
``selected``. Unset, either costs one dictionary lookup.

The points, by subcommand:

- ``hpctrain train``: ``train.start`` (start-up, before the first broadcast),
  ``train.first_step`` (before the first step's forward pass), ``train.step`` (after each
  step), ``train.reduce`` (on the communication thread, as a gradient bucket's allreduce
  begins), ``train.checkpoint`` (rank 0: the new checkpoint is written but not yet
  published; other ranks: as they pass the checkpoint), ``train.loss`` (``nan``/``inf``: the
  loss becomes non-finite), ``train.grad`` (``inf``: the gradients become infinite, the loss
  stays finite), ``train.perturb`` (``perturb``: one weight changes on that rank only);
  under ``--regime async-server`` also ``train.serve`` (rank 0, the server: a worker's gradient
  has arrived and that worker waits for the reply) and ``train.push`` (a worker, before it
  pushes a gradient to the server);
- ``hpctrain data``: ``data.write`` (after the first chunk of a synthetic data set is
  written);
- ``hpctrain.torch`` (any script): ``torch.init`` (``hvd.init``, before MPI starts: a rank
  lost there leaves the others waiting in ``MPI_Init``), ``torch.step`` (a
  ``DistributedOptimizer``'s ``step``, before it synchronizes); ``RANK`` is the rank the
  launcher gave the process, which an elastic job's shrinking does not change;
- ``hpctrain info``: ``info.gather`` (before the gather of the rank map), ``info.done``
  (after the table is printed);
- ``hpctrain bench allreduce``: ``bench.start`` (a rank's run begins, before any
  collective), ``bench.allreduce`` (after the barrier that starts a round of timed calls,
  just before the first of them, which the other ranks have entered; outside the timed loop,
  so that it costs the timings nothing), ``bench.corrupt`` (``selected``: one element of a
  checked result is made wrong);
- ``hpctrain study`` (one process: rank 0): ``study.start`` (before the study launches any
  job).
"""

import os
import signal
import sys
import time
from collections import Counter

from .elastic_job import ENV_RESTART

ENV = "HPCTRAIN_FAULT"

_hits = Counter()  # point -> how often this process has reached it (while a spec is set)


class InjectedFault(RuntimeError):
    """The failure that ``HPCTRAIN_FAULT`` asked for."""


def inject(point, rank):
    """Act on the item of ``HPCTRAIN_FAULT`` that names ``point`` for ``rank``, if any.

    Raises ``InjectedFault`` (``raise``), kills this process (``kill``) or this host's ranks
    (``kill-host``), or sleeps (``sleep=S``, then returns None); returns any other action's
    name for the caller to
    carry out; returns None when no item applies.
    """
    action = _action(point, rank)
    if action is None:
        return None
    # When it fired (wall clock, comparable across the processes of one machine): tests
    # measure how long the job takes to end after a fault, start-up excluded.
    sys.stderr.write(f"[hpctrain] fault {point!r} fires on rank {rank}: {action} "
                     f"(t={time.time():.3f})\n")
    sys.stderr.flush()
    if action == "raise":
        raise InjectedFault(f"injected fault at {point!r} on rank {rank} "
                            f"({ENV}={os.environ[ENV]})")
    if action == "kill-host":
        _kill_host()
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action.startswith("sleep="):
        time.sleep(float(action.partition("=")[2]))
        return None
    return action


def _kill_host():
    """SIGKILL this process's siblings (its launcher's other children here), then itself."""
    import psutil

    me = os.getpid()
    for sibling in psutil.Process(os.getppid()).children():
        if sibling.pid != me:
            try:
                os.kill(sibling.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass                          # already gone
    os.kill(me, signal.SIGKILL)


def selected(point, rank):
    """True if ``HPCTRAIN_FAULT`` names ``point`` for ``rank`` (this time, under ``#N``)."""
    return _action(point, rank) is not None


def reset():
    """Forget how often each point was reached (for tests that run several jobs in-process)."""
    _hits.clear()


def _action(point, rank):
    spec = os.environ.get(ENV)
    if not spec:
        return None
    _hits[point] += 1
    for item in spec.split(","):
        target, _, action = item.strip().partition(":")
        name, _, where = target.partition("@")
        ranks, _, when = where.partition("#")
        nth, _, start = when.partition("/")
        if (name == point and ranks in ("*", str(rank))
                and (not nth or int(nth) == _hits[point])
                and (not start or start == os.environ.get(ENV_RESTART, "0"))):
            return action or "raise"
    return None
