"""``hpctrain train --tensorboard``: rank 0's event files hold the figures of ``metrics.csv``
(read back with TensorBoard's own reader), every step's scalars and the run's settings as
hparams; after a crash they hold every epoch before it. Without the package, or with a
folder that cannot be written, the run ends before it trains, with one message."""

import csv
import math

import pytest
from mpi4py import MPI
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from hpctrain.data import synthetic
from hpctrain.errors import UsageError
from hpctrain.train import TrainConfig, load_config, train
from hpctrain.train.report import COLUMNS
from hpctrain.train.tensorboard import INSTALL

HANG = 120   # s: the mpirun fixture kills a launch that takes longer and fails the test


def events(folder):
    """``{tag: {step: value}}`` of the scalars in the event files of ``folder``."""
    reader = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    reader.Reload()
    return {tag: {e.step: e.value for e in reader.Scalars(tag)}
            for tag in reader.Tags()["scalars"]}


def hparams(folder):
    """The hparams of the run in ``folder``: ``{name: value}``."""
    reader = EventAccumulator(str(folder))
    reader.Reload()
    content = reader.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {name: getattr(value, value.WhichOneof("kind")) for name, value in start.hparams.items()}


def metrics(run_dir):
    """The rows of ``metrics.csv`` as dicts of numbers."""
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{key: float(value) for key, value in row.items()} for row in csv.DictReader(f)]


def assert_same_figures(scalars, rows):
    """Every number of every row is the scalar ``epoch/COLUMN`` at the row's step."""
    assert rows
    for row in rows:
        for column in COLUMNS:
            if column == "step" or math.isnan(row[column]):
                continue
            # metrics.csv keeps 6 significant digits, the event file a float32.
            assert scalars[f"epoch/{column}"][row["step"]] == pytest.approx(row[column],
                                                                           rel=1e-5), column


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synthetic.write(tmp_path_factory.mktemp("tb") / "data.h5", 64, (1, 4, 4), 4, seed=1)


def config(data, tmp_path, **changes):
    settings = dict(data=str(data), run_dir=str(tmp_path / "run"), hidden=8, epochs=3,
                    batch_size=8, allreduce="ring", progress="never", checkpoint_every="0",
                    tensorboard=str(tmp_path / "tb"))
    return TrainConfig(**{**settings, **changes})


def test_the_event_files_hold_the_figures_of_metrics_csv(data, tmp_path):
    result = train(config(data, tmp_path), MPI.COMM_SELF)
    scalars, rows = events(tmp_path / "tb"), metrics(tmp_path / "run")
    assert len(rows) == 3
    assert_same_figures(scalars, rows)
    # Every step, rank 0's own: its loss, the learning rate, the step's split.
    steps = list(range(1, result.step + 1))
    for tag in ("loss", "lr", "data_s", "compute_s", "exposed_comm_s"):
        assert sorted(scalars[f"step/{tag}"]) == steps, tag
    for row in rows:
        # The row's lr is its last step's.
        assert scalars["step/lr"][row["step"]] == pytest.approx(row["lr"], rel=1e-5)
    assert all(value >= 0 for value in scalars["step/data_s"].values())
    settings = hparams(tmp_path / "tb")
    assert settings["epochs"] == 3 and settings["allreduce"] == "ring"
    # (torch writes a bool as a number)
    assert settings["shuffle"] == 1 and set(settings) == set(TrainConfig().to_dict())


def test_a_bare_option_writes_under_the_run_directory(tmp_path):
    bare = load_config(overrides=[("run-dir", str(tmp_path)), ("tensorboard", None)])
    assert bare.tensorboard_path == tmp_path / "tensorboard"
    assert TrainConfig().tensorboard_path is None       # off by default


def test_without_the_package_the_run_ends_before_it_trains(data, tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "tensorboard", None)   # import fails
    with pytest.raises(UsageError) as raised:
        train(config(data, tmp_path), MPI.COMM_SELF)
    assert str(raised.value) == (f"--tensorboard {tmp_path / 'tb'}: the tensorboard package "
                                 f"is not installed (the tensorboard extra: {INSTALL})")
    assert not (tmp_path / "run").exists() and not (tmp_path / "tb").exists()


def test_a_folder_that_cannot_be_written_ends_the_run_before_it_trains(data, tmp_path):
    below_a_file = tmp_path / "file" / "tb"
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(UsageError, match=f"--tensorboard {below_a_file}: {tmp_path / 'file'} "
                                         f"is not a folder"):
        train(config(data, tmp_path, tensorboard=str(below_a_file)), MPI.COMM_SELF)
    assert not (tmp_path / "run").exists()


def test_without_the_package_every_rank_ends_with_one_line(mpirun, hpctrain_cmd, data,
                                                           tmp_path):
    # A package that fails to import, first on the path of every rank. Only rank 0 writes
    # event files, and only it looks: the verdict names it.
    hidden = tmp_path / "hide" / "tensorboard"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    run = mpirun(2, [*hpctrain_cmd, "train", f"--data={data}", "--hidden=8", "--epochs=1",
                     "--progress=never", f"--run-dir={tmp_path / 'run'}",
                     f"--tensorboard={tmp_path / 'tb'}"],
                 timeout=HANG, env={"PYTHONPATH": str(hidden.parent)})
    assert run.returncode == 2, run.output
    errors = [line for line in run.output.splitlines() if "tensorboard" in line]
    assert errors == [f"error: --tensorboard {tmp_path / 'tb'}: the tensorboard package is not "
                      f"installed (the tensorboard extra: {INSTALL}) (rank 0 of 2)"], run.output
    assert not (tmp_path / "run").exists() and not (tmp_path / "tb").exists()


def test_after_a_crash_the_files_hold_every_epoch_before_it(mpirun, hpctrain_cmd, data,
                                                            tmp_path):
    # 51 training rows, a global batch of 16: 4 steps per epoch. Rank 1 fails in its 6th
    # step, in epoch 2; rank 0 is ended by the abort without a word of its own.
    run = mpirun(2, [*hpctrain_cmd, "train", f"--data={data}", "--hidden=8", "--epochs=3",
                     "--batch-size=8", "--progress=never", "--checkpoint-every=0",
                     f"--run-dir={tmp_path / 'run'}", f"--tensorboard={tmp_path / 'tb'}"],
                 timeout=HANG, env={"HPCTRAIN_FAULT": "train.step@1#6"})
    assert run.returncode != 0, run.output
    rows = metrics(tmp_path / "run")
    assert [row["epoch"] for row in rows] == [1], run.output
    scalars = events(tmp_path / "tb")
    assert_same_figures(scalars, rows)
    assert sorted(scalars["epoch/epoch"]) == [4]
    assert set(range(1, 5)) <= set(scalars["step/loss"])


def test_a_folder_without_permission_is_named(tmp_path, monkeypatch):
    # (As root every folder is writable: the permission is what os.access answers.)
    from hpctrain.data import atomic
    from hpctrain.train import tensorboard

    monkeypatch.setattr(atomic.os, "access", lambda path, mode: False)
    with pytest.raises(UsageError, match=f"--tensorboard {tmp_path / 'a' / 'b'}: cannot write "
                                         f"in {tmp_path} \\(no permission\\)"):
        tensorboard.check(tmp_path / "a" / "b")


def test_a_resumed_run_goes_on_in_the_same_folder(data, tmp_path):
    # 7 steps an epoch. The run's last checkpoint is lost, so that it resumes from the one
    # of epoch 1 (step 7) and trains epoch 2 again: the event files keep epoch 1's row and
    # the epoch 2 of the run that resumed, as metrics.csv does.
    train(config(data, tmp_path, epochs=2, checkpoint_every="1"), MPI.COMM_SELF)
    run = tmp_path / "run"
    (run / "checkpoint.1.pt").replace(run / "checkpoint.pt")
    train(config(data, tmp_path, epochs=2, checkpoint_every="1", resume="auto"),
          MPI.COMM_SELF)
    rows = metrics(run)
    assert [(row["epoch"], row["step"]) for row in rows] == [(1, 7), (2, 14)]
    scalars = events(tmp_path / "tb")
    assert_same_figures(scalars, rows)
    assert sorted(scalars["epoch/epoch"]) == [7, 14]
