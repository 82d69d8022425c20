"""``python -m hpctrain.launch --elastic``: keep a job going when ranks are lost, by starting
it again from its last commit, on any MPI.

    python -m hpctrain.launch --elastic [--min-np N] [--max-np M] [--max-restarts K]
        [--host-discovery-script S [--discovery-interval SEC] | -H HOST:SLOTS,... |
         --hostfile F] [-np N] [--state-dir D] [--restart-delay SEC] [--ft | --no-ft]
        [MPIRUN OPTIONS --] COMMAND...

Each start runs ``mpirun -np NP -H HOSTS ... COMMAND`` (with the flags of
:func:`hpctrain.launch.mpirun_command`), NP = min(--max-np, the slots of the hosts), and
waits for it. What the ranks exit with decides what comes next (:mod:`hpctrain.elastic_job`):

- 0: the job is done; the launcher exits 0;
- 75 (``EXIT_HOSTS_UPDATED``): the launcher published more hosts in ``hosts.json`` and the
  ranks stopped at a commit: start again on them (not counted as a restart);
- 76 (``EXIT_TOO_FEW``): fewer ranks than --min-np are left; the launcher exits 76;
- anything else (a rank died, and mpirun ended the job): wait --restart-delay, ask the
  discovery script again for the hosts that are left, and start again from the last
  commit, at most --max-restarts times; exit 1 when they are used, 76 when fewer than
  --min-np slots are left.

Until a start is up (rank 0 logs ``up`` after the first sync: :func:`hpctrain.elastic_job.is_up`)
nothing in MPI detects a lost rank: ``MPI_Init`` waits for it for ever, and under ULFM mpirun
does not end the job. So the launcher watches the start's ranks that it can see
(:class:`LaunchRanks`) and ends a start that lost one (after ``START_GRACE_S``, in which it
may end by itself or come up): a failed start like any other, restarted as above.

Hosts come from the discovery script (Horovod's: one ``HOST[:SLOTS]`` per line, run again
every --discovery-interval seconds while the job runs, so that hosts added are used), else
-H or --hostfile (``HOST slots=N`` or ``HOST:N`` per line), else this machine with -np
slots; -np beside hosts caps the first start (as Horovod's does). The state folder
(--state-dir, else a new ``runs/elastic/DATE-TIME-PID``) holds the commit the ranks resume
from; a folder that holds one from an earlier run is resumed.

With a fault-tolerant MPI (ULFM: ``hpctrain.mpi.ulfm.fault_tolerance()`` says so for the
ranks' Python, and mpirun is Open MPI 5; or --ft) mpirun gets ``--with-ft ulfm --mca
async_mpi_finalize 1``: the survivors of a failure shrink the job in place and the launcher
starts it again only to grow it, or when that failed too. --no-ft: restarts.

SIGINT or SIGTERM to the launcher ends the job with every process it started (exit 128 +
the signal). Bad input ends it before anything is launched or written, with one line naming
the option, and exit status 2. The launcher says what it does in lines that begin with
``[hpctrain.launch]``, one per start and one per end; events.jsonl has the same with times.
"""

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from .. import elastic_job as contract
from ..data.atomic import writable_folder
from ..errors import UsageError
from ..mpi import ulfm as mpi_ulfm
from ..options import by_flag, checked_value, example, help_lines, option
from ..runtime import RANK_VARIABLES
from . import end_with_launcher, find_mpirun, kill_launch, launch_environment, mpirun_command
from . import split_options
from .hosts import DiscoveryError, discover, fit, given_hosts, host_list, ranks_for, total_slots

NAME = "python -m hpctrain.launch --elastic"
SAY = "[hpctrain.launch]"
#: mpirun options that would contradict the hosts and ranks the launcher chooses.
HOST_OPTIONS = ("-H", "--host", "-host", "--hostfile", "-hostfile", "--machinefile",
                "-machinefile", "-np", "-n", "--np", "-c")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: Seconds between two looks at a start that is not up yet (its ranks, events.jsonl).
START_POLL_S = 0.1
#: Seconds after which a local rank not seen yet, while the others were, counts as lost:
#: mpirun starts a machine's ranks together, within milliseconds.
UNSEEN_S = 3.0
#: Seconds a start that lost a rank before it was up has to end by itself or come up before
#: the launcher ends it: Open MPI without ULFM ends such a job within about 1 s.
START_GRACE_S = 3.0


@dataclasses.dataclass
class Options:
    """What ``--elastic`` was given: each option a field (:func:`hpctrain.options.option`),
    its spellings, range and help; checked as a whole by :func:`parse_options`."""

    command: list
    extra: list = dataclasses.field(default_factory=list)   # mpirun's own options
    min_np: int = option(1, "fewest ranks the job goes on with (default: {default})",
                         flags=("--min-np",), minimum=1, metavar="N")
    max_np: int = option(None, "most ranks (default: every slot of the hosts)",
                         flags=("--max-np",), minimum=1, metavar="M", example=4)
    max_restarts: int = option(3, "restarts after a failure before the launcher gives up "
                                  "(default: {default})",
                               flags=("--max-restarts",), minimum=0, metavar="K")
    discovery: str = option(None, "Horovod's discovery script: one HOST[:SLOTS] per line",
                            flags=("--host-discovery-script",), metavar="S",
                            example="./discover.sh")
    interval: float = option(None, "seconds between two runs of the discovery script "
                                   "(default: 5)", flags=("--discovery-interval",),
                             positive=True, unit="seconds", metavar="SEC", example=5)
    host_list: str = option(None, "hosts and their slots", flags=("-H", "--host"),
                            metavar="HOST:SLOTS,...", example="host1:4,host2:4")
    hostfile: str = option(None, "one HOST slots=N or HOST:N per line", flags=("--hostfile",),
                           metavar="F", example="hosts.txt")
    np: int = option(None, "ranks of the first start; alone: this machine with N slots",
                     flags=("-np", "-n"), minimum=1, metavar="N", example=4)
    state_dir: str = option(None, "the folder of the commit the ranks resume from (default: "
                                  "a new runs/elastic/DATE-TIME-PID)", flags=("--state-dir",),
                            metavar="D", example="runs/elastic/job1")
    restart_delay: float = option(1.0, "seconds between a failure and the next start (default: "
                                        "{default})",
                                  flags=("--restart-delay",), minimum=0, unit="seconds",
                                  metavar="SEC")
    ft: bool = option(None, "--ft: mpirun --with-ft ulfm; --no-ft: restarts (default: ULFM "
                            "when the MPI has it)", flags=("--ft",), off=("--no-ft",), flag=True)
    help: bool = option(False, "this text", flags=("-h", "--help"), flag=True)


#: option -> its field of :class:`Options`
OPTIONS = by_flag(Options)


def parse_options(argv):
    """:class:`Options` from the words after ``--elastic``; ``UsageError`` naming the option
    for anything wrong in them."""
    given, words, flags = {}, list(argv), set()
    while words and words[0].partition("=")[0] in OPTIONS:
        name, eq, text = words.pop(0).partition("=")
        f = OPTIONS[name]
        if f.type is bool:
            # An on/off switch: its off spelling (--no-ft) turns it off.
            if eq:
                raise UsageError(f"{name} takes no value (got {name}={text})")
            given[f.name] = name not in f.metadata["off"]
            flags.add(name)
            continue
        if not eq:
            if not words:
                raise UsageError(f"{name} needs a value; e.g. {name} {example(f).split()[-1]}")
            text = words.pop(0)
        given[f.name] = checked_value(f, text, name)
    if given.get("help"):
        return Options(command=[], help=True)
    if {"--ft", "--no-ft"} <= flags:
        raise UsageError("--ft and --no-ft: give one of them")
    try:
        extra, command = split_options(words)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    options = Options(command=command, extra=extra, **given)
    _check(options)
    return options


def _check(options):
    if not options.command:
        raise UsageError("--elastic needs a COMMAND to launch, after the options")
    if options.max_np is not None and options.min_np > options.max_np:
        raise UsageError(f"--min-np {options.min_np} is above --max-np {options.max_np}")
    sources = [name for name, value in (("--host-discovery-script", options.discovery),
                                        ("-H", options.host_list),
                                        ("--hostfile", options.hostfile))
               if value is not None]
    if len(sources) > 1:
        raise UsageError(f"{' and '.join(sources)}: give the hosts one way only")
    if not sources and options.np is None:
        raise UsageError("give the hosts: --host-discovery-script S, -H HOST:SLOTS,..., "
                         "--hostfile F, or -np N (N ranks on this machine)")
    if options.interval is not None and options.discovery is None:
        raise UsageError("--discovery-interval needs --host-discovery-script")
    clash = [word for word in options.extra if word.partition("=")[0] in HOST_OPTIONS]
    if clash:
        raise UsageError(f"mpirun option {clash[0]}: give the hosts and ranks to the launcher "
                         f"(-H, --hostfile, --host-discovery-script, -np, --max-np)")


def first_hosts(options):
    """The hosts of the first start, from whichever source ``options`` names;
    ``UsageError`` naming the option for a source that gives none that can be read."""
    try:
        if options.discovery is not None:
            return discover(options.discovery)
    except DiscoveryError as exc:
        raise UsageError(f"--host-discovery-script {options.discovery}: {exc}") from None
    return given_hosts(options.host_list, options.hostfile) or [("localhost", options.np)]


def start_np(options, hosts, first):
    """How many ranks a start on ``hosts`` gets: every slot, at most --max-np; the first
    start at most -np too (Horovod's meaning of -np beside hosts)."""
    np = ranks_for(hosts, options.max_np)
    return min(np, options.np) if first and options.np is not None else np


# --- the state folder and the MPI ---------------------------------------------------------

def state_folder(given):
    """The state folder to use (a ``Path``, not yet made): ``given``, else a new one under
    ``runs/elastic/``; ``UsageError`` when it cannot be made or written."""
    path = Path(given) if given else \
        Path("runs", "elastic", f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    return writable_folder("--state-dir", path)


def use_ulfm(forced, command, mpirun):
    """``(ulfm, why)``: whether mpirun gets ``--with-ft ulfm``. ``forced`` (--ft, --no-ft)
    decides, else :func:`hpctrain.mpi.ulfm.fault_tolerance` of the ranks' Python; either
    way only an Open MPI >= 5 ``mpirun`` takes the flag (``UsageError`` for --ft with
    another)."""
    if forced is False:
        return False, "--no-ft"
    version, said = open_mpi_version(mpirun)
    if version < 5:
        why = f"{mpirun} is {said}, which has no --with-ft ulfm (Open MPI 5 has)"
        if forced:
            raise UsageError(f"--ft: {why}")
        return False, why
    if forced:
        return True, "--ft"
    probe = getattr(mpi_ulfm, "fault_tolerance", None)
    if probe is None:
        return False, "hpctrain.mpi.ulfm cannot tell (no fault_tolerance())"
    try:
        verdict = probe(ranks_python(command))
    except Exception as exc:  # noqa: BLE001 - a failed probe means restarts, and says why
        return False, f"asking the MPI failed: {exc}"
    return verdict.available is True, verdict.detail


def open_mpi_version(mpirun):
    """``(major, what mpirun --version says)``; major 0 when it is no Open MPI."""
    try:
        said = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 0, f"not answering ({exc})"
    found = re.search(r"\(Open MPI\) ((\d+)\.[\d.]+)", said)
    if found is None:
        return 0, (said.splitlines() or ["silent"])[0]
    return int(found.group(2)), f"Open MPI {found.group(1)}"


def ranks_python(command):
    """The Python the ranks run: the command's first word where it is one, else ours."""
    found = shutil.which(command[0]) if command else None
    if found and re.fullmatch(r"python[\d.]*", Path(command[0]).name):
        return found
    return sys.executable


def elastic_command(np, hosts, command, *, settings, ulfm, extra=(), mpirun="mpirun",
                    tty=False):
    """The ``mpirun`` argv of one start: ``np`` ranks on ``hosts`` (``None``: this machine),
    the job's ``settings`` (``hpctrain.elastic_job``'s ``ENV_*``) exported to every rank with
    ``-x``, ULFM's flags when ``ulfm``, then the user's mpirun options ``extra``."""
    flags = [] if hosts is None else ["-H", host_list(hosts)]
    if ulfm:
        # Without async_mpi_finalize, Open MPI 5.0.11's MPI_Finalize after a rank's death
        # now and then waits for ever in every survivor (5 runs in 30 here; none with it).
        flags += ["--with-ft", "ulfm", "--mca", "async_mpi_finalize", "1"]
    for name, value in settings.items():
        flags += ["-x", f"{name}={value}"]
    return mpirun_command(np, command, mpirun=mpirun, extra=[*flags, *extra], tty=tty)


class Stopped(Exception):
    """The launcher was sent SIGINT or SIGTERM."""

    def __init__(self, signum):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


@contextlib.contextmanager
def stop_on_signals():
    """While in it, SIGINT and SIGTERM raise :class:`Stopped` (once: a second signal must
    not cut short the ending of the job that the first one began)."""
    def stop(signum, _frame):
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def say(message):
    """One line of the launcher's on stdout."""
    print(f"{SAY} {message}", flush=True)


def warn(message):
    """One warning line on stderr."""
    print(f"{SAY} warning: {message}", file=sys.stderr, flush=True)


def meaning(rc):
    """What mpirun's exit status ``rc`` says about the start."""
    if rc == 0:
        return "finished"
    if rc == contract.EXIT_HOSTS_UPDATED:
        return "hosts updated"
    if rc == contract.EXIT_TOO_FEW:
        return "too few ranks"
    if rc < 0:
        return f"mpirun ended by {_signal_name(-rc)}"
    if rc > 128:
        return f"a rank ended by {_signal_name(rc - 128)}"
    return "a rank failed"


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# --- the job ------------------------------------------------------------------------------

class LaunchRanks:
    """The ranks of a launch that this machine sees: the processes below its mpirun to which
    MPI gave a rank (a launcher's rank variable in their environment; not in mpirun's own,
    ``env``), without their own children. They are its ranks here, and on an emulated
    cluster of network namespaces every host's (one PID namespace); ranks on other machines
    are not seen, and there the ranks' own start-up bound ends the wait
    (:mod:`hpctrain.startup`).

    ``local``: the launch's ``local`` ranks all run here, started by mpirun at one moment
    (``-np`` alone). A rank killed between two looks at its first moments is never seen;
    one that has not been seen ``UNSEEN_S`` after the first rank was counts as lost too."""

    def __init__(self, pid, env, local=None):
        self.names = [name for name in RANK_VARIABLES if name not in env]
        self.root, self.ranks = psutil.Process(pid), {}     # pid -> (rank, psutil.Process)
        self.local, self.first_seen = local, None

    def lost(self):
        """``[(rank, pid)]`` of the ranks seen at an earlier look that have ended since, and
        ``(rank, None)`` of local ones never seen."""
        try:
            below = self.root.children(recursive=True)     # parents before their children
        except psutil.Error:
            below = []
        for proc in below:
            if proc.pid not in self.ranks:
                rank = self._rank(proc)
                if rank is not None:
                    self.ranks[proc.pid] = (rank, proc)
                    self.first_seen = self.first_seen or time.monotonic()
        gone = [(rank, pid) for pid, (rank, proc) in self.ranks.items() if not _running(proc)]
        if self.local and self.first_seen and time.monotonic() - self.first_seen > UNSEEN_S:
            seen = {rank for rank, _ in self.ranks.values()}
            gone += [(rank, None) for rank in range(self.local) if rank not in seen]
        return gone

    def _rank(self, proc):
        try:
            if proc.ppid() in self.ranks:
                return None     # a rank's own child (a data loader's worker, its watcher)
            environ = proc.environ()
        except psutil.Error:
            return None
        found = [environ[name] for name in self.names if environ.get(name, "").isdigit()]
        return int(found[0]) if found else None


def _running(proc):
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ElasticJob:
    """The starts of one elastic job, one after the other. Each runs ``mpirun`` on the hosts
    of the moment; what it exits with (:mod:`hpctrain.elastic_job`) decides the next."""

    def __init__(self, options, hosts, folder, *, mpirun, ulfm):
        self.options, self.hosts, self.folder = options, hosts, folder
        self.mpirun, self.ulfm = mpirun, ulfm
        self.version, self.published = contract.read_hosts(folder)
        self.published = self.published or []
        self.starts = 0                  # mpirun launches made
        self.restarts = 0                # launches after a failure (at most --max-restarts)
        self.launched_at = 0.0           # time.time() of the last launch
        self.known = 0                   # ranks the hosts held at the last look
        # -np alone means this machine, where mpirun needs no host list (as a plain launch).
        self.local = options.discovery is None and options.host_list is None \
            and options.hostfile is None
        self.discovery_failing = False   # warned of, and no good answer since
        self.cut_short = None            # why the launcher ended the last start, if it did

    def run(self):
        """Start the job until it finishes or cannot go on; the launcher's exit status."""
        why = "first start"
        while True:     # each pass is a restart (bounded) or a start on more ranks
            rc, version = self.start(why)
            if rc == 0:
                return self.end(0, f"job finished after {self.starts} start(s), "
                                   f"{self.restarts} restart(s)")
            if rc == contract.EXIT_TOO_FEW:
                return self.end(rc, f"fewer than --min-np {self.options.min_np} ranks left: "
                                    f"the ranks ended the job (exit {rc})")
            if rc == contract.EXIT_HOSTS_UPDATED and self.version > version:
                why = "hosts added"
                continue
            ended = self.after_failure(rc)
            if ended is not None:
                return ended
            why = f"restart {self.restarts} of {self.options.max_restarts}"

    def start(self, why):
        """Launch once and wait for it; ``(mpirun's exit status, the hosts version it
        started with)``."""
        np = start_np(self.options, self.hosts, first=self.starts == 0)
        self.starts, self.known = self.starts + 1, ranks_for(self.hosts, self.options.max_np)
        hosts = fit(self.hosts, np)
        self.publish(hosts, new=hosts != self.published)
        version = self.version
        if (self.folder / contract.STATE_FILE).exists():
            whence = f"from the commit in {self.folder}"
        else:
            # hpctrain train --elastic commits to its own checkpoints, not to state.pt.
            whence = "no commit in the state folder yet"
        say(f"start {self.starts}: np {np} on {host_list(hosts)} ({why}, {whence})")
        argv = elastic_command(np, None if self.local else hosts, self.options.command,
                               settings=self.settings(),
                               ulfm=self.ulfm, extra=self.options.extra, mpirun=self.mpirun,
                               tty=sys.stdout.isatty())
        contract.log_event(self.folder, "launch", start=self.starts, np=np,
                           hosts=[list(h) for h in hosts], restart=self.restarts,
                           hosts_version=version, argv=argv)
        self.launched_at, began = time.time(), time.monotonic()
        env, self.cut_short = self.environment(), None
        proc = subprocess.Popen(argv, env=env, start_new_session=True,
                                preexec_fn=end_with_launcher)
        rc = self.watch(proc, np, LaunchRanks(proc.pid, env, np if self.local else None))
        seconds = time.monotonic() - began
        contract.log_event(self.folder, "exit", start=self.starts, rc=rc,
                           seconds=round(seconds, 3))
        say(f"end {self.starts}: exit {rc} after {seconds:.1f} s "
            f"({self.cut_short or meaning(rc)})")
        return rc, version

    def settings(self):
        """The next start's settings for its ranks (``hpctrain.elastic_job``'s ``ENV_*``)."""
        found = {contract.ENV_DIR: str(self.folder.resolve()),
                 contract.ENV_MIN_NP: str(self.options.min_np),
                 contract.ENV_RESTART: str(self.starts - 1),
                 contract.ENV_HOSTS_VERSION: str(self.version)}
        if self.options.max_np is not None:
            found[contract.ENV_MAX_NP] = str(self.options.max_np)
        return found

    def environment(self):
        """The launch's environment: ours without an MPI runtime's variables, with the
        job's settings (also given as ``-x``, which is what reaches other hosts)."""
        env = launch_environment()
        for name in (contract.ENV_DIR, contract.ENV_MIN_NP, contract.ENV_MAX_NP,
                     contract.ENV_RESTART, contract.ENV_HOSTS_VERSION):
            env.pop(name, None)
        return {**env, **self.settings()}

    def watch(self, proc, np, ranks):
        """Wait for ``proc`` (mpirun), asking for more hosts every --discovery-interval;
        its exit status. Until the start is up, ``ranks`` (its :class:`LaunchRanks`) are
        watched too, and one that is lost ends the start (:meth:`cut`). Whatever ends the
        wait (a signal) ends mpirun and its ranks too."""
        try:
            if not self.until_up(proc, np, ranks):
                return proc.wait()
            if self.options.discovery is None:
                return proc.wait()
            while True:     # ends with mpirun
                try:
                    return proc.wait(timeout=self.interval)
                except subprocess.TimeoutExpired:
                    self.look_for_more_hosts(np)
        finally:
            if proc.poll() is None:
                kill_launch(proc)

    @property
    def interval(self):
        """Seconds between two looks for more hosts."""
        return self.options.interval or 5.0

    def until_up(self, proc, np, ranks):
        """Wait until this start is up (``True``), or has ended (``False``): by itself, or
        cut short because one of its ranks was lost before it was up (:meth:`cut`), for
        then its other ranks may wait for it for ever (``MPI_Init`` has no failure
        detection, under ULFM too)."""
        looked = time.monotonic()
        while not contract.is_up(self.folder, self.starts, self.launched_at):
            try:
                proc.wait(timeout=START_POLL_S)
                return False
            except subprocess.TimeoutExpired:
                pass
            lost = ranks.lost()
            if lost:
                return self.cut(proc, lost)
            if self.options.discovery is not None and time.monotonic() - looked > self.interval:
                self.look_for_more_hosts(np)
                looked = time.monotonic()
        return True

    def cut(self, proc, lost):
        """A start lost ranks ``lost`` (``[(rank, pid)]``) before it was up: give it
        ``START_GRACE_S`` to end by itself (Open MPI without ULFM ends a job whose rank
        died, as it does one whose ranks all exit, on bad input) or to come up (survivors
        of a death after ``MPI_Init`` shrink in place), then end it. Whether it came up."""
        deadline = time.monotonic() + START_GRACE_S
        while time.monotonic() < deadline:
            try:
                proc.wait(timeout=START_POLL_S)
                return False
            except subprocess.TimeoutExpired:
                pass
            if contract.is_up(self.folder, self.starts, self.launched_at):
                return True
        ranks = ", ".join(f"rank {rank} (pid {pid})" if pid else
                          f"rank {rank} (gone before it was seen)" for rank, pid in lost)
        self.cut_short = "a rank lost while the start was not up: ended by the launcher"
        say(f"start {self.starts}: {ranks} ended before the start was up, and the other ranks "
            f"would wait for it for ever: ending the start")
        contract.log_event(self.folder, "lost_in_start", start=self.starts,
                           ranks=[rank for rank, _ in lost])
        kill_launch(proc)
        return False

    def look_for_more_hosts(self, np):
        """Run the discovery script; when its hosts hold more ranks than at the last look,
        and more than the job runs on, publish them as a new version of ``hosts.json``: the
        ranks see it at their next commit and end with ``EXIT_HOSTS_UPDATED``."""
        found = self.discover_again()
        if found is None:
            return
        more = ranks_for(found, self.options.max_np)
        grew, self.known = more > self.known, more
        running = self.running_np(np)
        if not grew or more <= running:
            return
        self.hosts = found
        hosts = fit(found, more)
        self.publish(hosts, new=True)
        say(f"more hosts: {host_list(hosts)} (np {running} -> {more}); published as "
            f"hosts.json version {self.version}: the ranks end this start at their next commit")
        contract.log_event(self.folder, "hosts_updated", version=self.version, np=more,
                           hosts=[list(h) for h in hosts])

    def running_np(self, np):
        """How many ranks this start runs on now: ``np``, unless the ranks shrank in place
        since it began (ULFM; rank 0 logs ``shrunk`` events)."""
        shrunk = [e for e in contract.read_events(self.folder)
                  if e["event"] == "shrunk" and e["time"] >= self.launched_at]
        return shrunk[-1]["after"] if shrunk else np

    def discover_again(self):
        """The discovery script's hosts now, or ``None`` (with one warning until it answers
        well again) when it fails: the job keeps the hosts it has."""
        try:
            found = discover(self.options.discovery)
        except DiscoveryError as exc:
            if not self.discovery_failing:
                warn(f"--host-discovery-script {self.options.discovery}: {exc}; keeping the "
                     f"hosts {host_list(self.hosts)}")
            self.discovery_failing = True
            return None
        self.discovery_failing = False
        return found

    def publish(self, hosts, *, new):
        """Write ``hosts`` to ``hosts.json``, as a new version when ``new``."""
        if new or not self.version:
            self.version += 1
        self.published = hosts
        contract.write_hosts(self.folder, self.version, hosts)

    def after_failure(self, rc):
        """After a start that failed: ``None`` when the job may start again (on the hosts
        that are left), else the launcher's exit status."""
        if rc == contract.EXIT_HOSTS_UPDATED:
            warn(f"the ranks ended with {rc} (hosts updated), but no new hosts were "
                 f"published: counted as a failure")
        if self.restarts >= self.options.max_restarts:
            return self.end(1, f"giving up: start {self.starts} ended with exit {rc} "
                               f"({meaning(rc)}) and the restarts are used "
                               f"(--max-restarts {self.options.max_restarts})")
        # A lost host takes a moment to leave the discovery script's answer.
        time.sleep(self.options.restart_delay)
        if self.options.discovery is not None:
            found = self.discover_again()
            self.hosts = self.hosts if found is None else found
        if ranks_for(self.hosts, self.options.max_np) < self.options.min_np:
            return self.end(contract.EXIT_TOO_FEW,
                            f"fewer than --min-np {self.options.min_np} ranks left: "
                            f"{total_slots(self.hosts)} slot(s) on {host_list(self.hosts)} "
                            f"after start {self.starts} failed")
        self.restarts += 1
        return None

    def end(self, status, message):
        """Log the end of the job and say why (an error on stderr); ``status``."""
        contract.log_event(self.folder, "end", status=status, reason=message,
                           starts=self.starts, restarts=self.restarts)
        if status == 0:
            say(message)
        else:
            print(f"{NAME}: {message}", file=sys.stderr, flush=True)
        return status


def main(argv):
    """``python -m hpctrain.launch --elastic ...`` (the words after ``--elastic``); the
    exit status."""
    try:
        options = parse_options(argv)
        if options.help:
            print(f"{__doc__}\noptions:\n{help_lines(Options)}")
            return 0
        hosts = first_hosts(options)
        folder = state_folder(options.state_dir)
        mpirun = find_mpirun()
        ulfm, why = use_ulfm(options.ft, options.command, mpirun)
    except (UsageError, FileNotFoundError) as exc:
        print(f"{NAME}: {exc}", file=sys.stderr, flush=True)
        return 2
    np = start_np(options, hosts, first=True)
    if np < options.min_np:
        print(f"{NAME}: {np} rank(s) to start ({total_slots(hosts)} slot(s) on "
              f"{host_list(hosts)}), fewer than --min-np {options.min_np}: nothing launched",
              file=sys.stderr, flush=True)
        return contract.EXIT_TOO_FEW
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"{NAME}: --state-dir {folder}: {exc.strerror}", file=sys.stderr, flush=True)
        return 2
    resumed = (folder / contract.STATE_FILE).exists()
    say(f"state folder {folder}" + (": resuming from its commit (state.pt)" if resumed else ""))
    if ulfm:
        say(f"lost ranks: the survivors go on in place (mpirun --with-ft ulfm: {why}); the job "
            f"starts again to grow")
    else:
        say(f"lost ranks: the job starts again from the last commit (no ULFM: {why})")
    job = ElasticJob(options, hosts, folder, mpirun=mpirun, ulfm=ulfm)
    with stop_on_signals():
        try:
            return job.run()
        except Stopped as stop:
            return job.end(128 + stop.signum, f"stopped by {stop}: the job and every "
                                               "process it started have been ended")
