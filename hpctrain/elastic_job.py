"""An elastic job's contract: what its launcher and its ranks (``hvd.elastic.run``,
``hpctrain train --elastic``) share: settings in the environment, the job's state folder and
its files, exit statuses. No MPI, no torch: the launcher (:mod:`hpctrain.launch`) imports it
before any rank exists.

An elastic job keeps going when ranks are lost, in one of two ways:

- **in place**, on an MPI with fault tolerance (ULFM, Open MPI 5 under ``mpirun --with-ft
  ulfm``): the survivors revoke the world, shrink it and go on from the last commit
  (:mod:`hpctrain.torch.elastic.in_place`, for ``hvd.elastic.run`` and ``hpctrain train
  --elastic`` alike);
- **by restart**, on any MPI: the job ends, and ``python -m hpctrain.launch --elastic``
  starts it again on the hosts that are left, from the last commit, which rank 0 saved in
  the state folder.

The state folder (``HPCTRAIN_ELASTIC_DIR``) holds

- ``state.pt``: the last committed state (written by rank 0 at every ``commit``, atomically);
- ``hosts.json``: ``{"version": N, "hosts": [[host, slots], ...]}``, written by the launcher
  when the hosts change; a rank's ``commit`` that sees a newer version than the one its job
  started with raises ``HostsUpdatedInterrupt`` on every rank;
- ``events.jsonl``: one JSON object per line, appended by the launcher and by rank 0 (what
  happened when: a launch, the start up, a rank lost before it, an exit, a shrink, a
  restored commit), from which the cost of a failure is measured.

**A start is up** once every rank has started MPI, set up its world and synced the state
(the end of the first sync of ``hvd.elastic.run``; the first broadcast of ``hpctrain train
--elastic``): rank 0 then logs ``up`` (:func:`log_up`). Until then the job has no failure
detection of its own (``MPI_Init`` waits for a dead rank for ever, even under ULFM), so the
launcher watches the start's processes and ends the start when one is lost
(:func:`is_up` tells it when to stop), and each rank bounds its own wait
(:mod:`hpctrain.startup`). From then on a lost rank is the ranks' to survive in place (ULFM)
or mpirun's to end the job (any other MPI).
"""

import json
import os
import time
from pathlib import Path

from . import units
from .data.atomic import atomic_path

#: The state folder of the job (set by the launcher; a script may set it itself).
ENV_DIR = "HPCTRAIN_ELASTIC_DIR"
#: The fewest ranks the job may go on with.
ENV_MIN_NP = "HPCTRAIN_ELASTIC_MIN_NP"
#: The most ranks the job may use.
ENV_MAX_NP = "HPCTRAIN_ELASTIC_MAX_NP"
#: How many times the launcher has started the job before this start (0 the first time).
ENV_RESTART = "HPCTRAIN_ELASTIC_RESTART"
#: The version of ``hosts.json`` this start was made with.
ENV_HOSTS_VERSION = "HPCTRAIN_ELASTIC_HOSTS_VERSION"

#: The event rank 0 logs when the start is up (:func:`log_up`).
EVENT_UP = "up"

STATE_FILE = "state.pt"
HOSTS_FILE = "hosts.json"
EVENTS_FILE = "events.jsonl"

#: Every rank exits with this after a ``HostsUpdatedInterrupt`` that the job cannot take in
#: place (more hosts): the launcher starts it again on the new hosts, from the commit.
EXIT_HOSTS_UPDATED = 75
#: Every rank exits with this when fewer than the minimum of ranks are left: the launcher
#: does not start the job again.
EXIT_TOO_FEW = 76


def state_dir(environ=None):
    """The state folder (a ``Path``), or ``None`` when the job has none."""
    value = (os.environ if environ is None else environ).get(ENV_DIR)
    return Path(value) if value else None


def int_setting(name, default, environ=None, least=1):
    """The integer setting ``name`` of the environment, else ``default``; ``ValueError``
    naming it when it is not a whole number >= ``least``."""
    value = (os.environ if environ is None else environ).get(name)
    if value in (None, ""):
        return default
    try:
        return units.number(value, int, minimum=least)
    except ValueError as exc:
        raise ValueError(f"{name}={value!r}: give {exc}") from None


def parse_hosts(text, source):
    """``[(host, slots), ...]`` from lines ``HOST[:SLOTS]`` (Horovod's discovery script
    format; blank lines and ``#`` comments skipped). ``ValueError`` naming ``source`` and
    the line for anything else."""
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        host, _, slots = line.partition(":")
        if not host or any(c.isspace() for c in host) or (slots and not slots.isdigit()) \
                or slots == "0":
            raise ValueError(f"{source}, line {number}: {line!r} is not HOST or HOST:SLOTS "
                             f"(SLOTS a whole number >= 1)")
        hosts.append((host, int(slots) if slots else 1))
    return hosts


def read_hosts(folder):
    """``(version, [(host, slots), ...])`` from ``folder/hosts.json``; ``(0, None)`` when
    there is none."""
    path = Path(folder) / HOSTS_FILE
    if not path.exists():
        return 0, None
    data = json.loads(path.read_text())
    return int(data["version"]), [(h, int(s)) for h, s in data["hosts"]]


def write_hosts(folder, version, hosts):
    """Publish ``hosts`` as ``version`` in ``folder/hosts.json`` (atomically)."""
    with atomic_path(Path(folder) / HOSTS_FILE) as tmp:
        tmp.write_text(json.dumps({"version": version, "hosts": [list(h) for h in hosts]}))


def log_event(folder, event, **fields):
    """Append ``{"event": event, "time": <unix seconds>, **fields}`` to ``events.jsonl``."""
    if folder is None:
        return
    record = {"event": event, "time": time.time(), **fields}
    with open(Path(folder) / EVENTS_FILE, "a") as out:
        out.write(json.dumps(record) + "\n")


def this_start(environ=None):
    """The launcher's number of this start (1 the first time; ``HPCTRAIN_ELASTIC_RESTART``
    counts the starts before it)."""
    return int_setting(ENV_RESTART, 0, environ, least=0) + 1


def log_up(rank, **fields):
    """The start is up: every rank has started and synced (call it on every rank, once,
    after the first sync). Rank ``rank`` 0 logs it."""
    if rank == 0:
        log_event(state_dir(), EVENT_UP, start=this_start(), **fields)


def is_up(folder, start, since):
    """Whether the start numbered ``start``, launched at ``since`` (unix seconds; a state
    folder resumed by another launcher holds starts of the same numbers), is up."""
    try:
        events = read_events(folder)
    except ValueError:
        return False        # a line half written as we read: the next look sees it whole
    return any(e["event"] == EVENT_UP and e.get("start") == start and e["time"] >= since
               for e in events)


def read_events(folder):
    """The events of ``folder``, in order."""
    path = Path(folder) / EVENTS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
