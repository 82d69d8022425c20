"""What rank 0 tells the user: the run's header, a progress bar, one line per epoch, a CSV.

Only rank 0 creates these objects' output; the loop passes ``enabled=False`` elsewhere.
"""

import csv
import math
import os
import sys
import time

from ..data.atomic import atomic_path
# Set to 1 by our local launcher (python -m hpctrain.launch, behind scripts/mpirun and
# scripts/run) for every rank when the launcher's own stdout is a terminal.
from ..launch import PROGRESS_TTY

#: Columns of ``metrics.csv``, one row per epoch (times in seconds, means over ranks).
COLUMNS = ("epoch", "steps", "step", "lr", "train_loss", "train_acc", "val_loss", "val_acc",
           "samples", "samples_per_s", "epoch_s", "data_s", "compute_s", "exposed_comm_s",
           "comm_s", "staleness_mean", "staleness_max")


class Progress:
    """A one-line progress bar redrawn with a carriage return; silent when disabled.

    Plain characters only (no terminal escape codes) and at most a few redraws a second, so
    that a log that catches it anyway stays readable.
    """

    WIDTH = 24
    INTERVAL = 0.25  # seconds between redraws

    def __init__(self, total, label, enabled, stream=None):
        self.total, self.label, self.enabled = max(total, 1), label, enabled
        self.stream = stream or sys.stdout
        self._last, self._width = 0.0, 0

    def update(self, done, text=""):
        """Redraw, at most every ``INTERVAL`` seconds and always at the end."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.INTERVAL and done < self.total:
            return
        self._last = now
        filled = self.WIDTH * min(done, self.total) // self.total
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self._draw(f"{self.label} [{bar}] {done}/{self.total} {text}")

    def _draw(self, line):
        # Pad with spaces to cover the longer line drawn before.
        self.stream.write("\r" + line.ljust(self._width))
        self.stream.flush()
        self._width = len(line)

    def close(self):
        """Erase the bar, leaving the line free for the epoch summary."""
        if self.enabled and self._width:
            self._draw("")
            self.stream.write("\r")
            self.stream.flush()


def progress_enabled(mode, rank, stream=None, environ=None):
    """Whether to draw the bar: rank 0 only; ``auto`` only when the output is a terminal.

    Open MPI's mpirun gives its ranks a pseudo-terminal as stdout even when its own output
    goes to a file or a pipe, so a terminal seen under mpirun proves nothing. Only the
    launcher knows where the output ends: under mpirun, ``auto`` draws when it exported
    ``HPCTRAIN_PROGRESS_TTY=1``, and draws no bar otherwise (``--progress always`` does).
    """
    if rank != 0 or mode == "never":
        return False
    if mode == "always":
        return True
    environ = os.environ if environ is None else environ
    if environ.get(PROGRESS_TTY) == "1":
        return True
    return (stream or sys.stdout).isatty() and "OMPI_COMM_WORLD_SIZE" not in environ


def epoch_line(row, epochs):
    """The one-line summary of an epoch."""
    comm = row["comm_s"]
    exposed = row["exposed_comm_s"]
    hidden = "" if math.isnan(comm) or comm <= 0 else \
        f", {100 * max(0.0, 1 - exposed / comm):.0f}% hidden"
    total = "n/a" if math.isnan(comm) else f"{comm:.2f}"
    line = (f"epoch {row['epoch']:>3}/{epochs}  loss {row['train_loss']:.4f}  "
            f"acc {100 * row['train_acc']:6.2f}%  val_loss {row['val_loss']:.4f}  "
            f"val_acc {100 * row['val_acc']:6.2f}%  {row['samples_per_s']:8.0f} samples/s  "
            f"time {row['epoch_s']:.2f} s: data {row['data_s']:.2f}  "
            f"compute {row['compute_s']:.2f}  exposed comm {exposed:.2f} "
            f"(comm {total}{hidden})")
    if not math.isnan(row["staleness_mean"]):
        line += f"  staleness mean {row['staleness_mean']:.2f} max {row['staleness_max']:.0f}"
    return line


class MetricsFile:
    """``metrics.csv`` in the run directory: a header, then one row per epoch.

    ``append=True`` (a resumed run) continues an existing file, keeping only the rows of the
    first ``epochs_done`` epochs: the checkpoint came before the later rows (a crash, or a
    stop at max_steps mid-epoch), and the resumed run writes them again.
    """

    def __init__(self, path, append=False, enabled=True, epochs_done=None):
        self.path, self.enabled = path, enabled
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not (append and path.exists()):
                with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
                    csv.writer(f).writerow(COLUMNS)
            elif epochs_done is not None:
                self._keep_epochs(epochs_done)

    def _keep_epochs(self, count):
        with open(self.path, newline="") as f:
            rows = list(csv.reader(f))
        column = COLUMNS.index("epoch")
        kept = rows[:1] + [r for r in rows[1:] if len(r) == len(COLUMNS) and
                           r[column].isdigit() and int(r[column]) <= count]
        if len(kept) < len(rows):
            with atomic_path(self.path) as tmp, open(tmp, "w", newline="") as f:
                csv.writer(f).writerows(kept)

    def write(self, row):
        """Append one epoch's row."""
        if self.enabled:
            with open(self.path, "a", newline="") as f:
                csv.writer(f).writerow([_cell(row[c]) for c in COLUMNS])


def _cell(value):
    return f"{value:.6g}" if isinstance(value, float) else value
