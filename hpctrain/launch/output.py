"""The output of a launch: every rank's lines tagged with its rank, as horovodrun does, and
one root-cause block at the end of a job that failed, as torchrun does.

    python -m hpctrain.launch.output [--tag-output | --no-tag-output] -- LAUNCHER ARGS...

runs ``LAUNCHER`` (``mpirun`` or ``srun``; jobs/lib/launch.sh starts its steps this way, and
``hpctrain-horovodrun`` and ``python -m hpctrain.launch`` call :func:`run`). The launcher is
asked to label each line with its rank (mpirun ``--tag-output``: ``[JOB,RANK]<stdout>:``;
srun ``--label``: ``RANK: ``), so that this process can tell the ranks' lines apart; it
writes each one to the stream it came on, as ``[RANK]<stdout>:LINE`` (``--tag-output``) or
as the rank wrote it (``--no-tag-output``). Lines of the launcher's own pass as they are.
A line a rank is still writing (a progress bar redrawn with ``\\r``) is passed on as it
comes, not held until its end.

From the same lines it learns who failed (:class:`Failures`):

- hpctrain's guard (:func:`hpctrain.runtime.end_job`, behind ``python -m hpctrain`` and
  ``hvd.init()``): ``[hpctrain] rank R of N on HOST (pid P) failed (exit status S) at
  TIME:``, then the rank's traceback or message;
- a Python traceback that a rank printed without the guard (``python -m mpi4py``);
- mpirun's notices: ``MPI_ABORT was invoked on rank R ... with errorcode S``, ``process
  rank R with PID P on node HOST exited on signal N (NAME)``, ``Process name: [[J,R]] Exit
  code: S``; srun's: ``srun: error: HOST: task R: Exited with exit code S`` (or the signal).

When the job ends with a non-zero status this process writes one block on stderr: the first
rank to fail (by the time the guard stamped, else by when its notice was read), its host,
pid, exit status or signal, and the first lines of its error (a traceback's exception and
the frame that raised it). Bad input that the ranks agreed on (every rank exits 2 after
rank 0 said why, :mod:`hpctrain.runtime`) is not a failure: no block. Its exit status is
the launcher's (128 + N for a launcher ended by signal N, and for this process stopped by
signal N, which it passes on to the launcher: SIGTERM, SIGHUP, SIGINT).
"""

import calendar
import collections
import dataclasses
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time

from ..runtime import stamp
from . import end_with_launcher

#: Each launcher's option that labels every line with its rank.
LABELS = {"mpirun": ["--tag-output"], "srun": ["--label"]}
#: Program names of each launcher.
PROGRAMS = {"mpirun": "mpirun", "mpiexec": "mpirun", "orterun": "mpirun", "srun": "srun"}
#: Lines of a failed rank's error that the block shows.
ERROR_LINES = 6
#: Seconds another rank's whole line waits for the end of a line written in part.
HOLD_S = 0.2
#: Lines after the guard's header kept for the block (a traceback's end is what it shows).
KEPT_LINES = 200
#: A rank's status when its error is bad input, which it has said itself (errors.UsageError).
BAD_INPUT = 2

_MPIRUN_TAG = re.compile(rb"\[\d+,(\d+)\]<(?:stdout|stderr|stddiag)>:")
_SRUN_LABEL = re.compile(rb" *(\d+): ")
#: The first bytes of an mpirun tag, cut off by a read.
_TAG_START = re.compile(rb"\[\d*(?:,\d*(?:\](?:<[a-z]*>?)?)?)?")
_GUARD = re.compile(r"\[hpctrain\] rank (\d+)(?: of (\d+))? on (\S+) \(pid (\d+)\) failed"
                    r"(?: \(exit status (-?\d+)\))?(?: at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
                    r"(?:\.\d+)?) UTC)?:\s*$")
_TRACEBACK = "Traceback (most recent call last):"
_ABORT = re.compile(r"MPI_ABORT was invoked on rank (\d+) in communicator")
_ERRORCODE = re.compile(r"with errorcode (-?\d+)")
_SIGNALLED = re.compile(r"process rank (\d+) with PID (\d+) on node (\S+) exited on signal "
                        r"(\d+)(?: \(([^)]*)\))?")
_PROCESS = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")
_EXIT_CODE = re.compile(r"Exit code:\s*(-?\d+)")
_SRUN_ERROR = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.*?)\s*$")
_SRUN_EXIT = re.compile(r"Exited with exit code (\d+)")


@dataclasses.dataclass
class Failure:
    """What the output says of one rank's failure."""

    rank: int
    seen: float                 # time.time() when the launcher's output first said it
    at: float = None            # when the rank failed, as hpctrain's guard stamped it
    stamped: str = None         # that stamp as it wrote it
    size: int = None
    host: str = None
    pid: int = None
    status: int = None          # its exit status
    signal: str = None          # or the signal that ended it, as the launcher names it
    lines: list = dataclasses.field(default_factory=list)   # its error, as it printed it

    @property
    def time(self):
        """When it failed: the guard's stamp, else when the launcher read of it."""
        return self.at if self.at is not None else self.seen

    def bad_input(self):
        """True for a rank that ended on bad input it reported itself: no failure."""
        return self.status == BAD_INPUT and self.signal is None and not any(
            line.startswith(_TRACEBACK) for line in self.lines)


class Failures:
    """The failures that a launch's output tells of, from the ranks' lines and the
    launcher's; :meth:`root_cause` is the first. Lines may come from two threads."""

    def __init__(self):
        self.failures = {}          # rank -> Failure
        self.recent = {}            # rank -> its last lines on stderr
        self._collecting = {}       # rank -> the Failure whose error lines follow
        self._abort = None          # the rank of an MPI_ABORT notice, awaiting its code
        self._process = None        # the rank of an mpirun exit notice, awaiting its code
        self._lock = threading.Lock()

    def _failure(self, rank, now=None):
        if rank not in self.failures:
            self.failures[rank] = Failure(rank, time.time() if now is None else now)
        return self.failures[rank]

    def rank_line(self, rank, text, stderr=True):
        """A whole line that rank ``rank`` wrote (``text``, without its end)."""
        with self._lock:
            if stderr:
                recent = self.recent.setdefault(rank, collections.deque(maxlen=ERROR_LINES))
                recent.append(text)
            header = _GUARD.match(text)
            if header:
                failure = self._failure(int(header.group(1)))
                failure.lines = []
                failure.size = int(header.group(2)) if header.group(2) else None
                failure.host, failure.pid = header.group(3), int(header.group(4))
                if header.group(5) is not None:
                    failure.status = int(header.group(5))
                if header.group(6):
                    failure.at = _parse_utc(header.group(6))
                    failure.stamped = f"{header.group(6)} UTC"
                self._collecting[rank] = failure
            elif rank in self._collecting:
                failure = self._collecting[rank]
                if len(failure.lines) < KEPT_LINES:
                    failure.lines.append(text)
            elif stderr and text.startswith(_TRACEBACK):
                # A traceback without the guard's header: the rank failed, and says no more.
                failure = self._failure(rank)
                failure.lines = [text]
                self._collecting[rank] = failure

    def launcher_line(self, text):
        """A whole line of the launcher's own (mpirun's, srun's)."""
        with self._lock:
            self._notice(text.strip())

    def _notice(self, text):
        abort = _ABORT.search(text)
        if abort:
            self._abort = int(abort.group(1))
        code = _ERRORCODE.search(text)
        if code and self._abort is not None:
            self._set_status(self._abort, int(code.group(1)))
            self._abort = None
        signalled = _SIGNALLED.search(text)
        if signalled:
            failure = self._failure(int(signalled.group(1)))
            # (Open MPI names PID 0 where it did not learn the rank's pid.)
            failure.pid = int(signalled.group(2)) or failure.pid
            failure.host = signalled.group(3)
            failure.signal = _signal_text(int(signalled.group(4)), signalled.group(5))
        process = _PROCESS.search(text)
        if process:
            self._process = int(process.group(1))
        code = _EXIT_CODE.search(text)
        if code and self._process is not None:
            self._set_status(self._process, int(code.group(1)))
            self._process = None
        srun = _SRUN_ERROR.search(text)
        if srun:
            host, what = srun.group(1), srun.group(3)
            exited = _SRUN_EXIT.search(what)
            for rank in _task_list(srun.group(2)):
                failure = self._failure(rank)
                failure.host = failure.host or host
                if exited:
                    self._set_status(rank, int(exited.group(1)))
                elif failure.signal is None:
                    failure.signal = what

    def _set_status(self, rank, status):
        failure = self._failure(rank)
        if failure.status is None:
            failure.status = status

    def root_cause(self):
        """The first :class:`Failure` by time, or ``None`` when no rank failed (bad input
        that the ranks reported is no failure)."""
        with self._lock:
            failed = [f for f in self.failures.values() if not f.bad_input()]
        return min(failed, key=lambda f: (f.time, f.rank)) if failed else None

    def block(self, name, status):
        """The root-cause block, lines without their end, for a launch by ``name`` that
        exited with ``status``; ``[]`` when it succeeded or no rank failed."""
        if status == 0:
            return []
        first = self.root_cause()
        if first is None:
            if self.failures:
                return []       # bad input, which the ranks have reported
            return _framed(name, [f"  no rank's failure was seen: the launcher exited with "
                                  f"status {status}"])
        others = sorted(f.rank for f in self.failures.values()
                        if f is not first and not f.bad_input())
        rank = f"{first.rank}" + (f" (of {first.size})" if first.size else "")
        lines = [f"  rank:   {rank}", f"  host:   {first.host or 'not said'}"]
        if first.pid is not None:
            lines.append(f"  pid:    {first.pid}")
        lines.append(f"  time:   {first.stamped or stamp(first.time)}")
        exits = [f"signal {first.signal}" if first.signal else "",
                 f"status {first.status}" if first.status is not None else ""]
        lines.append(f"  exit:   {', '.join(e for e in exits if e) or 'not said'}")
        error = error_lines(first.lines)
        lines += [f"  {'error:' if i == 0 else '':<7} {line}" for i, line in enumerate(error)]
        if not error:
            last = [line for line in self.recent.get(first.rank, ()) if line.strip()]
            lines += [f"  {'last:' if i == 0 else '':<7} {line}" for i, line in enumerate(last)]
            if not last:
                lines.append("  error:  the rank printed none")
        lines.append(f"  then:   {_then(others)}; the launcher exited with status {status}")
        return _framed(name, lines)


def error_lines(lines, limit=ERROR_LINES):
    """The first lines of an error as a rank printed it: for a Python traceback, the
    exception that ends it and the frame that raised it; else its first lines."""
    if not any(line.startswith(_TRACEBACK) for line in lines):
        return [line for line in lines if line.strip()][:limit]
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    last = frames[-1] if frames else lines.index(_TRACEBACK)
    rest = lines[last + 1:]
    # The frame's source line and its carets are indented; the exception is not.
    start = next((i for i, line in enumerate(rest) if line and not line[0].isspace()),
                 len(rest))
    exception = [line for line in rest[start:] if line.strip()][:limit - 1]
    return [*exception, f"({lines[last].strip()})"] if frames else exception


def _then(others):
    if not others:
        return "no other rank failed on its own"
    listed = ", ".join(map(str, others[:8])) + (", ..." if len(others) > 8 else "")
    return f"rank{'s' if len(others) > 1 else ''} {listed} ended after it"


def _framed(name, lines):
    rule = "=" * 78
    return [rule, f"{name}: the job failed. Root cause (the first failure seen):", *lines,
            rule]


def _task_list(text):
    """``"0,2-3"`` -> ``[0, 2, 3]``."""
    ranks = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            ranks += range(int(low), int(high or low) + 1) if (high or low).isdigit() else []
    return ranks


def _signal_text(number, name):
    try:
        known = signal.Signals(number).name
    except ValueError:
        known = None
    return f"{number} ({known or name})" if known or name else str(number)


def _parse_utc(text):
    # The guard's stamp (hpctrain.runtime.stamp) back to seconds.
    whole, _, fraction = text.partition(".")
    base = calendar.timegm(time.strptime(whole, "%Y-%m-%d %H:%M:%S"))
    return base + (float(f"0.{fraction}") if fraction else 0.0)


# --- relaying the output ----------------------------------------------------------------------

class Relay:
    """One of the launcher's streams (stdout or stderr), copied to ``out``: each rank's lines
    with its tag (``tag``) or bare, the launcher's own as they are; every whole line told to
    ``failures``.

    srun labels whole lines. mpirun forwards what a rank wrote in pieces, each piece with
    its tag, and a tag after every newline inside a piece: a line may come in parts (a
    progress bar redrawn with ``\\r``), between parts of other ranks' lines. Each rank's
    bytes are kept apart; a part is written as it comes while no other rank's line is half
    written, else when its line is whole.
    """

    def __init__(self, source, out, failures, *, launcher, tag, stderr):
        self.source, self.out, self.failures = source, out, failures
        self.pieces = launcher == "mpirun"
        self.label = {"mpirun": _MPIRUN_TAG, "srun": _SRUN_LABEL}.get(launcher)
        self.tag, self.stderr = tag, stderr
        self.stream = b"stderr" if stderr else b"stdout"
        self.raw = b""              # read, not parsed yet
        self.current = None         # mpirun: the rank whose piece the next bytes continue
        self.unwritten = {}         # rank -> its bytes not written yet
        self.lines = {}             # rank -> its line so far, for the failures
        self.open = None            # the rank whose line is written in part
        self.opened = 0.0           # since when (time.monotonic())

    def run(self):
        """Copy until the launcher closes the stream."""
        while True:
            if not select.select([self.source], [], [], HOLD_S)[0]:
                self._write()           # lines held for a line in parts that stopped
                self.out.flush()
                continue
            chunk = os.read(self.source, 65536)
            if not chunk:
                break
            self.raw += chunk
            self._parse()
            self.out.flush()        # once a read: a line in parts is seen as it comes
        self._parse(end=True)
        self._write_all()
        self.out.flush()

    def _parse(self, end=False):
        # Through self.raw by position: a slice of what is left for every line would copy
        # the read's 64 KiB once a line.
        raw, pos = self.raw, 0
        while pos < len(raw):
            if self.current is not None:
                stop = self._rank_stop(raw, pos, end)
                if stop is None:
                    break
                rank, data, pos = self.current, raw[pos:stop], stop
                if data.endswith(b"\n") or not self.pieces or end or self.label.match(raw, pos):
                    self.current = None
                self._rank_data(rank, data)
                continue
            match = self.label.match(raw, pos) if self.label else None
            if match is not None and (self.pieces or raw.find(b"\n", pos) >= 0 or end):
                self.current, pos = int(match.group(1)), match.end()
                continue
            newline = raw.find(b"\n", pos)
            if not end and (newline < 0 or self.pieces and _TAG_START.fullmatch(raw, pos)):
                break           # the rest of a line, or of a tag, is still to come
            stop = newline + 1 if newline >= 0 else len(raw)
            self._own(raw[pos:stop] if newline >= 0 else raw[pos:] + b"\n")
            pos = stop
        self.raw = raw[pos:]

    def _rank_stop(self, raw, pos, end):
        """Where the current rank's bytes from ``pos`` end: at its line's end or the next
        tag; ``None`` when they have to wait for more."""
        newline = raw.find(b"\n", pos)
        stop = len(raw) if newline < 0 else newline + 1
        if self.pieces:
            tag = self.label.search(raw, pos, stop)
            if tag is not None:
                stop = tag.start()
            elif newline < 0 and not end:
                # Not a tag's first bytes: they may be the next piece's, cut by the read.
                cut = raw.rfind(b"[", pos)
                if cut >= 0 and _TAG_START.fullmatch(raw, cut):
                    stop = cut
        elif newline < 0 and not end:
            return None
        if stop == pos and not (self.pieces and self.label.match(raw, pos)):
            return None
        return stop

    def _rank_data(self, rank, data):
        self.unwritten[rank] = self.unwritten.get(rank, b"") + data
        line = self.lines.get(rank, b"") + data
        *whole, self.lines[rank] = line.split(b"\n")
        for text in whole:
            self.failures.rank_line(rank, text.decode(errors="replace").rstrip("\r"),
                                    self.stderr)
        self._write()

    def _write(self):
        # The rank whose line is half written goes first. Another rank's whole lines wait
        # for its end (mpirun forwards the rest of a line in its next piece) for HOLD_S; a
        # line in parts that stays open longer (a progress bar) is ended then, not a part.
        moved = True
        while moved:
            moved = False
            for rank in sorted(self.unwritten, key=lambda r: r != self.open):
                data = self.unwritten[rank]
                if self.open not in (None, rank):
                    if b"\n" not in data or time.monotonic() - self.opened < HOLD_S:
                        continue
                    data = data[:data.rindex(b"\n") + 1]     # its whole lines only
                self._emit(rank, data)
                rest = self.unwritten[rank][len(data):]
                if rest:
                    self.unwritten[rank] = rest
                else:
                    del self.unwritten[rank]      # (only ranks with bytes to write are kept)
                moved = True
                break                             # (the dict changed: look again)

    def _write_all(self):
        # Every rank's part of a line still unwritten, each ended where it stops.
        for rank in sorted(self.unwritten, key=lambda r: r != self.open):
            self._emit(rank, self.unwritten[rank])
        self.unwritten.clear()
        if self.open is not None:
            self.out.write(b"\n")
            self.open = None

    def _emit(self, rank, data):
        """Write ``data`` of ``rank`` (lines, and maybe the first part of one), each line
        with its tag; a line that another rank has in part is ended first."""
        if self.open not in (None, rank):
            self.out.write(b"\n")
            self.open = None
        if self.tag:
            tag = b"[%d]<%s>:" % (rank, self.stream)
            body = data[:-1].replace(b"\n", b"\n" + tag) + data[-1:]
            data = body if self.open == rank else tag + body
        self.out.write(data)
        if data.endswith(b"\n"):
            self.open = None
        elif self.open != rank:
            self.open, self.opened = rank, time.monotonic()

    def _own(self, line):
        # A line of the launcher's own: after the ranks' parts of lines.
        self._write_all()
        self.out.write(line)
        self.failures.launcher_line(line.decode(errors="replace").rstrip("\n"))


def launcher_of(argv):
    """``"mpirun"``, ``"srun"`` or ``None``: the launcher that ``argv`` runs."""
    return PROGRAMS.get(os.path.basename(argv[0])) if argv else None


def labelled(argv):
    """``argv`` with its launcher's option that labels every line with its rank."""
    return [argv[0], *LABELS.get(launcher_of(argv), []), *argv[1:]]


def run(argv, env=None, *, tag=True, name="hpctrain", stdout=None, stderr=None):
    """Run the launch ``argv`` (``mpirun ...``, ``srun ...``) with its lines labelled,
    relay them (tagged with ``tag``), then, if it failed, write the root-cause block of
    ``name`` on stderr; return its exit status.

    SIGTERM and SIGHUP are passed on to the launcher, and SIGINT where no terminal gave it
    to the launcher already; this process goes on relaying until the launcher has ended.
    """
    stdout = stdout or sys.stdout.buffer
    stderr = stderr or sys.stderr.buffer
    launcher = launcher_of(argv)
    failures = Failures()
    proc = subprocess.Popen(labelled(argv), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=_relayed)
    stopped = []                # the signals this process passed on
    previous = _pass_signals(proc, stopped, launcher)
    try:
        relays = [Relay(pipe.fileno(), out, failures, launcher=launcher, tag=tag,
                        stderr=out is stderr)
                  for pipe, out in ((proc.stdout, stdout), (proc.stderr, stderr))]
        threads = [threading.Thread(target=relay.run, daemon=True) for relay in relays]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        status = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    status = 128 - status if status < 0 else status
    if stopped:
        # Not the job's failure: whoever stopped it knows why.
        sig = signal.Signals(stopped[0]).name
        block = [f"{name}: stopped by {sig}, which it passed on to {launcher or argv[0]}"]
        status = 128 + stopped[0]
    else:
        block = failures.block(name, status)
    if block:
        stderr.write(("\n".join(block) + "\n").encode())
        stderr.flush()
    return status


def _relayed():
    # In the launcher's process before its exec: it ends when this process dies (even by
    # SIGKILL), and then, its output's reader gone, it must not die of SIGPIPE on its next
    # line before it has ended its ranks (it would leave them running).
    end_with_launcher()
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def _pass_signals(proc, stopped, launcher):
    """Pass SIGTERM, SIGHUP and SIGINT on to ``proc``, noting each in ``stopped``; return
    the handlers replaced. SIGINT from a terminal reaches the launcher itself (one process
    group): not passed twice."""
    def pass_on(signum, _frame):
        stopped.append(signum)
        if proc.poll() is None:
            # srun takes one SIGINT for a request of its status (a second within a second
            # ends the step); SIGTERM ends it.
            proc.send_signal(signal.SIGTERM if launcher == "srun" else signum)

    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.signal(
        signal.SIGINT, signal.SIG_IGN if os.isatty(0) else pass_on)
    return previous


USAGE = ("usage: python -m hpctrain.launch.output [--tag-output | --no-tag-output] -- "
         "LAUNCHER ARGS...")


def main(argv=None):
    """``python -m hpctrain.launch.output [--tag-output|--no-tag-output] -- LAUNCHER ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    tag = True
    while argv and argv[0] in ("--tag-output", "--no-tag-output"):
        tag = argv.pop(0) == "--tag-output"
    if argv[:1] != ["--"] or len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        return run(argv[1:], tag=tag, name=os.path.basename(argv[1]))
    except OSError as exc:
        print(f"python -m hpctrain.launch.output: cannot run {argv[1]}: {exc}",
              file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
