"""What rank 0 shows: when ``--progress auto`` draws the bar, in-process and under mpirun."""

import re
import sys

import pytest

from hpctrain.data import synthetic
from hpctrain.train import report
from hpctrain.train.report import PROGRESS_TTY, progress_enabled

UNDER_MPIRUN = {"OMPI_COMM_WORLD_SIZE": "2"}
#: The bar of a whole epoch of 12 steps. (The mpirun fixture reads the output as text, with
#: universal newlines: the carriage return before each redraw arrives as a newline.)
BAR = re.compile(r"\nepoch 1/2 \[#{24}\] 12/12 loss \d")


class Stream:
    """A stdout that is, or is not, a terminal."""

    def __init__(self, tty):
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.mark.parametrize("environ, tty, drawn", [
    ({}, True, True),                                       # one process on a terminal
    ({}, False, False),                                     # one process into a file
    (UNDER_MPIRUN, True, False),        # mpirun's pseudo-terminal proves nothing
    ({**UNDER_MPIRUN, PROGRESS_TTY: "1"}, True, True),      # our launcher saw a terminal
    ({**UNDER_MPIRUN, PROGRESS_TTY: "1"}, False, True),     # ... whatever the rank's stdout
    ({**UNDER_MPIRUN, PROGRESS_TTY: "0"}, True, False),     # only "1" means a terminal
    ({PROGRESS_TTY: "1"}, False, True),
])
def test_auto_draws_on_rank_0_where_the_output_is_seen(environ, tty, drawn):
    assert progress_enabled("auto", 0, Stream(tty), environ) is drawn
    assert progress_enabled("auto", 1, Stream(tty), environ) is False


@pytest.mark.parametrize("mode, drawn", [("always", True), ("never", False)])
def test_always_and_never_ignore_the_terminal(mode, drawn):
    for environ in ({}, {**UNDER_MPIRUN, PROGRESS_TTY: "1"}):
        for tty in (True, False):
            assert progress_enabled(mode, 0, Stream(tty), environ) is drawn
            assert progress_enabled(mode, 1, Stream(tty), environ) is False


def test_auto_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.delenv(PROGRESS_TTY, raising=False)
    assert not progress_enabled("auto", 0, Stream(True))
    monkeypatch.setenv(PROGRESS_TTY, "1")
    assert progress_enabled("auto", 0, Stream(True))


def test_the_bar_is_erased_for_the_epoch_line():
    out = []
    stream = type("Out", (), {"write": lambda self, t: out.append(t), "flush": lambda self: 0})()
    bar = report.Progress(4, "epoch 1/2", True, stream)
    bar.update(4, "loss 0.5")
    bar.close()
    line = "epoch 1/2 [" + "#" * 24 + "] 4/4 loss 0.5"
    assert "".join(out) == "\r" + line + "\r" + " " * len(line) + "\r"


# --- launched under mpirun --------------------------------------------------------------------

@pytest.fixture(scope="module")
def train_cmd(tmp_path_factory):
    data = synthetic.write(tmp_path_factory.mktemp("data") / "bar.h5", 120, (1, 4, 4), 4,
                           seed=3)
    return [sys.executable, "-m", "hpctrain", "train", f"--data={data}", "--hidden=8",
            "--epochs=2", "--batch-size=4", "--allreduce=ring", "--progress=auto"]


@pytest.mark.parametrize("exported, drawn", [({PROGRESS_TTY: "1"}, True), ({}, False)],
                         ids=["launcher-on-a-terminal", "plain-mpirun"])
def test_the_main_job_draws_a_bar_per_epoch_when_the_launcher_says_so(
        mpirun, train_cmd, tmp_path, exported, drawn):
    run = mpirun(2, [*train_cmd, f"--run-dir={tmp_path}"], timeout=120, env=exported)
    assert run.returncode == 0, run.output
    if drawn:
        assert BAR.search(run.output) and "\nepoch 2/2 [" in run.output, run.output
    else:
        assert "epoch 1/2 [" not in run.output, run.output
    assert "epoch   2/2  loss" in run.output
