"""TensorBoard event files of a run (``--tensorboard DIR``): what ``metrics.csv`` holds, and
every step, for TensorBoard and the trackers that read its files (MLflow, Weights & Biases).

Rank 0 writes them, with ``torch.utils.tensorboard`` (the optional ``tensorboard`` package:
``pip install 'hpctrain[tensorboard]'``). Every scalar is at the optimizer step it belongs
to, the x axis of every chart:

- each step, rank 0's own: ``step/loss`` (its batch's mean loss), ``step/lr``, and the
  step's time split into ``step/data_s``, ``step/compute_s`` and ``step/exposed_comm_s``;
- each epoch, at its last step: every column of ``metrics.csv`` as ``epoch/COLUMN``
  (``epoch/train_loss``, ``epoch/val_acc``, ``epoch/samples_per_s``, ``epoch/data_s``, ...;
  the figures of the row, means over ranks), less those that are not numbers (NaN);
- once, the run's configuration as hparams, with ``epoch/val_acc`` and ``epoch/val_loss``
  as its metrics.

The file is flushed at the end of every epoch, so that after a crash it holds every epoch
before it. A resumed run's file starts with a purge at the step after its checkpoint's: TensorBoard
then drops what the run before it wrote after its checkpoint, as ``metrics.csv`` drops its
rows.

The steps' scalars are kept in memory and written at the epoch's end, outside its timed
steps, or once they have waited ``STEPS_WAIT_S`` (an epoch of hours still shows its steps).
Writing an event costs about 0.1 ms (tensorboard checksums it in Python): in every step,
rank 0 would be late by that much, 7 % of a digits MLP step here, and the measurement would
be the worse for it.
"""

import math
import time

from ..data.atomic import writable_folder
from ..errors import UsageError
from .report import COLUMNS

#: The extra that installs the package, as the error names it.
INSTALL = "pip install 'hpctrain[tensorboard]'"
#: Columns of metrics.csv that are the x axis, not scalars.
AXIS = ("step",)
#: The hparams view's metrics: scalars written by :meth:`EventLog.epoch`.
HPARAM_METRICS = ("epoch/val_acc", "epoch/val_loss")
#: The step's scalars, as :meth:`EventLog.step` takes them.
STEP_TAGS = ("loss", "lr", "data_s", "compute_s", "exposed_comm_s")
#: Seconds the steps' scalars may wait in memory before they are written in a step.
STEPS_WAIT_S = 30.0


def check(path):
    """Local, no communication: ``UsageError`` in one line unless event files can be
    written to ``path``: the ``tensorboard`` package is importable, and ``path`` is a folder,
    or can be made one, that this process may write in. Nothing is created."""
    try:
        import tensorboard  # noqa: F401 - torch.utils.tensorboard writes with it
    except ImportError:
        raise UsageError(f"--tensorboard {path}: the tensorboard package is not installed "
                         f"(the tensorboard extra: {INSTALL})") from None
    path = writable_folder("--tensorboard", path)


class EventLog:
    """The event files of one run in ``path``; silent when not ``enabled`` (ranks other
    than 0) or when ``path`` is ``None``. ``purge_step``: the first step of a resumed run
    (its checkpoint's + 1): what an earlier run wrote from there on is dropped."""

    def __init__(self, path, config, enabled=True, purge_step=None):
        self.writer, self.steps, self.since = None, [], time.monotonic()
        if path is None or not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        # flush_secs: the file is flushed at each epoch's end; between two, every few seconds.
        self.writer = SummaryWriter(str(path), purge_step=purge_step or None, flush_secs=10)
        self._hparams(config)

    def _hparams(self, config):
        from torch.utils.tensorboard.summary import hparams

        # Written into this run's own file (SummaryWriter.add_hparams would open another).
        for summary in hparams(config.to_dict(), dict.fromkeys(HPARAM_METRICS, math.nan)):
            self.writer.file_writer.add_summary(summary)

    def step(self, step, loss, lr, data_s, compute_s, exposed_comm_s):
        """One optimizer step's scalars, at ``step`` (counted from 1): kept, and written with
        the epoch's row (or after ``STEPS_WAIT_S``)."""
        if self.writer is None:
            return
        if not self.steps:
            self.since = time.monotonic()
        self.steps.append((step, (loss, lr, data_s, compute_s, exposed_comm_s)))
        if time.monotonic() - self.since > STEPS_WAIT_S:
            self._write_steps()

    def _write_steps(self):
        for step, values in self.steps:
            for tag, value in zip(STEP_TAGS, values):
                self.writer.add_scalar(f"step/{tag}", value, step)
        self.steps = []

    def epoch(self, row):
        """The epoch's steps, then its row of ``metrics.csv`` at its ``step``; then flush
        the file."""
        if self.writer is None:
            return
        self._write_steps()
        for column in COLUMNS:
            value = row[column]
            if column not in AXIS and not (isinstance(value, float) and math.isnan(value)):
                self.writer.add_scalar(f"epoch/{column}", value, row["step"])
        self.writer.flush()

    def close(self):
        """Write the steps kept, flush and close the file."""
        if self.writer is not None:
            self._write_steps()
            self.writer.close()
            self.writer = None
