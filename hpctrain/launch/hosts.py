"""Where an elastic job's ranks may run: hosts as ``[(host, slots), ...]``, read from mpirun's
``-H`` list, a hostfile or a discovery script (Horovod's: a program that prints one
``HOST[:SLOTS]`` per line, the hosts of the moment), and how many ranks a start puts on them.
"""

import os
import shutil
import subprocess
from pathlib import Path

from ..elastic_job import parse_hosts
from ..errors import UsageError
from . import kill_launch

#: Seconds a discovery script may take; one that takes longer is killed and counts as failed.
DISCOVERY_TIMEOUT = 30


def parse_host_list(text, source):
    """``[(host, slots), ...]`` from ``HOST[:SLOTS],...`` (mpirun's -H); ``ValueError``
    naming ``source`` and the entry for anything else."""
    hosts = []
    for entry in text.split(","):
        try:
            hosts += parse_hosts(entry, source)
        except ValueError:
            raise ValueError(f"{source}: {entry!r} is not HOST or HOST:SLOTS (SLOTS a whole "
                             f"number >= 1), e.g. -H host1:4,host2:4") from None
    return hosts


def given_hosts(host_list, hostfile):
    """The hosts of ``-H`` (``host_list``) or ``--hostfile``, whichever is given (``None``
    when neither is); ``UsageError`` naming the option for a file that cannot be read, an
    entry or line that is not a host, or a source that names none."""
    try:
        if host_list is not None:
            source, hosts = f"-H {host_list}", parse_host_list(host_list, f"-H {host_list}")
        elif hostfile is not None:
            source = f"--hostfile {hostfile}"
            hosts = parse_hostfile(Path(hostfile).read_text(), source)
        else:
            return None
    except OSError as exc:
        raise UsageError(f"--hostfile {hostfile}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not hosts:
        raise UsageError(f"{source} names no host, e.g. -H host1:4,host2:4")
    return hosts


def parse_hostfile(text, source):
    """``[(host, slots), ...]`` from a hostfile: ``HOST slots=N`` (Open MPI's and Horovod's
    form; other ``key=value`` words are ignored) or ``HOST[:SLOTS]`` per line."""
    lines = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        slots = [w.partition("=")[2] for w in words[1:] if w.startswith("slots=")]
        lines.append(f"{words[0]}:{slots[0]}" if words and slots else " ".join(words))
    return parse_hosts("\n".join(lines), source)


def total_slots(hosts):
    """The slots of ``hosts`` together."""
    return sum(slots for _, slots in hosts)


def ranks_for(hosts, max_np):
    """How many ranks a start on ``hosts`` gets: every slot, at most ``max_np``."""
    total = total_slots(hosts)
    return total if max_np is None else min(total, max_np)


def fit(hosts, np):
    """The first of ``hosts`` that hold ``np`` ranks, the last one's slots cut to fit."""
    chosen, left = [], np
    for host, slots in hosts:
        if left <= 0:
            break
        chosen.append((host, min(slots, left)))
        left -= slots
    return chosen


def host_list(hosts):
    """``host:slots,...``: mpirun's -H, and how the launcher names hosts."""
    return ",".join(f"{host}:{slots}" for host, slots in hosts) or "no hosts"


class DiscoveryError(Exception):
    """The discovery script failed, timed out, or printed something that is not hosts."""


def discovery_script(script):
    """The absolute path of the discovery script ``script`` (a path, or a command on PATH);
    ``DiscoveryError`` when it is missing or not executable."""
    path = Path(script)
    if "/" not in script and not path.exists() and shutil.which(script):
        path = Path(shutil.which(script))
    if not path.is_file():
        raise DiscoveryError("no such file")
    if not os.access(path, os.X_OK):
        raise DiscoveryError(f"not executable (chmod +x {script})")
    return str(path.resolve())


def discover(script):
    """The hosts that the discovery script ``script`` prints now (run with a time limit);
    ``DiscoveryError`` saying what went wrong."""
    script = discovery_script(script)
    # A session of its own: a script that hangs is killed with what it started, which
    # would otherwise hold its output open and keep us waiting past the timeout.
    proc = subprocess.Popen([script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=DISCOVERY_TIMEOUT)
    except subprocess.TimeoutExpired:
        kill_launch(proc)
        raise DiscoveryError(f"no answer within {DISCOVERY_TIMEOUT} s") from None
    except BaseException:
        kill_launch(proc)
        raise
    if proc.returncode != 0:
        said = " | ".join((out + err).strip().splitlines())[-300:] or "nothing"
        raise DiscoveryError(f"exited with status {proc.returncode}, saying {said!r}")
    try:
        return parse_hosts(out, "its output")
    except ValueError as exc:
        raise DiscoveryError(str(exc)) from None
