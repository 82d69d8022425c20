"""Data sets in HDF5: the digits, synthetic data, reading rows, the split, the CLI."""

import subprocess
import sys

import h5py
import numpy as np
import pytest

from hpctrain.data import HDF5Dataset, digits, hdf5, split_indices, synthetic, write_arrays
from hpctrain.data.atomic import atomic_path
from hpctrain.errors import UsageError


@pytest.fixture(scope="module")
def digits_file(tmp_path_factory):
    return digits.prepare(tmp_path_factory.mktemp("data") / "digits.h5")


def test_digits_file_holds_the_whole_data_set(digits_file):
    with HDF5Dataset(digits_file) as data:
        assert len(data) == 1797 and data.sample_shape == (1, 8, 8)
        assert data.num_classes == 10
        x, y = data.read(np.arange(len(data)))
    assert x.dtype == np.float32 and 0.0 <= x.min() and x.max() <= 1.0
    assert sorted(set(y.tolist())) == list(range(10))


def test_read_returns_rows_in_the_order_asked_with_repeats(tmp_path):
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    path = write_arrays(tmp_path / "small.h5", x, np.arange(10) % 3, classes=3)
    with HDF5Dataset(path) as data:
        rows = [7, 2, 2, 9, 0]
        got_x, got_y = data.read(rows)
        assert np.array_equal(got_x, x[rows]) and got_y.tolist() == [1, 2, 2, 0, 0]
        empty_x, empty_y = data.read([])
        assert empty_x.shape == (0, 2) and empty_y.shape == (0,)


def test_read_touches_only_the_rows_asked_for(tmp_path, monkeypatch):
    path = write_arrays(tmp_path / "small.h5", np.zeros((50, 3)), np.zeros(50), classes=2)
    read = []
    original = h5py.Dataset.__getitem__

    def spy(self, index):
        read.append(np.asarray(index).tolist())
        return original(self, index)

    with HDF5Dataset(path) as data:
        monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
        data.read([30, 4, 30])
    assert read == [[4, 30], [4, 30]]  # samples and labels: sorted, unique, nothing else


def test_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist.*hpctrain data prepare digits"):
        HDF5Dataset(tmp_path / "nothing.h5")


def test_not_an_hdf5_file_is_a_usage_error(tmp_path):
    path = tmp_path / "text.h5"
    path.write_text("hello")
    with pytest.raises(UsageError, match="not a readable HDF5 file"):
        HDF5Dataset(path)


def test_wrong_dataset_names_list_what_the_file_holds(digits_file):
    with pytest.raises(UsageError, match=r"no dataset 'images' \(option 'x'\); it holds: x, y"):
        HDF5Dataset(digits_file, x="images")


def test_mismatched_rows_and_float_labels_are_rejected(tmp_path):
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros((4, 2))
        f["y"] = np.zeros(3, dtype=np.int64)
        f["fy"] = np.zeros(4)
    with pytest.raises(UsageError, match="equal rows"):
        HDF5Dataset(path)
    with pytest.raises(UsageError, match="must be integers"):
        HDF5Dataset(path, y="fy")


def test_user_files_with_other_names_and_no_class_attribute(tmp_path):
    path = tmp_path / "user.h5"
    with h5py.File(path, "w") as f:
        f["train/images"] = np.ones((6, 4), dtype=np.float64)
        f["train/labels"] = np.array([0, 4, 1, 1, 2, 0], dtype=np.int32)
    with HDF5Dataset(path, x="train/images", y="train/labels") as data:
        assert data.num_classes == 5 and data.sample_shape == (4,)


@pytest.mark.parametrize("label, classes, message", [
    (-1, 3, r"must be class indices 0 to 2 \(its attribute 'classes' is 3\), but they range "
            r"from -1 to 2"),
    (3, 3, r"must be class indices 0 to 2 .*, but they range from 0 to 3"),
    (-2, None, r"must be class indices >= 0 \(without a 'classes' attribute, classes = the "
               r"largest label \+ 1\), but they range from -2 to 2"),
])
def test_labels_out_of_range_are_a_usage_error_at_load(tmp_path, monkeypatch, label, classes,
                                                       message):
    # The bad label sits in the last of several chunks: every chunk is checked.
    monkeypatch.setattr(hdf5, "LABEL_CHUNK", 4)
    y = np.arange(10) % 3
    y[9] = label
    path = tmp_path / "labels.h5"
    with h5py.File(path, "w") as f:
        f["x"], f["y"] = np.zeros((10, 2), np.float32), y
        if classes is not None:
            f["y"].attrs["classes"] = classes
    with pytest.raises(UsageError, match=message):
        HDF5Dataset(path)


def test_synthetic_data_has_the_asked_shape_and_classes(tmp_path):
    path = synthetic.write(tmp_path / "s.h5", 5000, (1, 4, 4), 7, seed=3)
    with HDF5Dataset(path) as data:
        assert len(data) == 5000 and data.sample_shape == (1, 4, 4)
        assert data.num_classes == 7
        _, y = data.read(np.arange(5000))
    assert set(y.tolist()) == set(range(7))


@pytest.mark.parametrize("text, shape", [("1x28x28", (1, 28, 28)), ("64", (64,)),
                                         ("3X8x8", (3, 8, 8))])
def test_parse_shape(text, shape):
    assert synthetic.parse_shape(text) == shape


@pytest.mark.parametrize("text", ["", "1x0", "axb", "1x-2"])
def test_parse_shape_rejects_bad_shapes(text):
    with pytest.raises(UsageError, match="bad sample shape"):
        synthetic.parse_shape(text)


def test_atomic_path_leaves_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "out.bin"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]
    with atomic_path(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new" and list(tmp_path.iterdir()) == [target]


def test_split_is_seeded_disjoint_and_complete():
    train, val = split_indices(101, 0.2, seed=4)
    assert len(val) == 20 and len(train) == 81
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(101))
    again = split_indices(101, 0.2, seed=4)
    assert np.array_equal(again[0], train) and np.array_equal(again[1], val)
    assert not np.array_equal(split_indices(101, 0.2, seed=5)[1], val)
    assert len(split_indices(10, 0.0)[1]) == 0


def test_data_cli_writes_both_kinds(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "hpctrain", "data", *args],
                              capture_output=True, text=True, timeout=120)

    result = run("prepare", "digits", "--out", str(tmp_path / "d.h5"))
    assert result.returncode == 0 and "1797 samples" in result.stdout
    result = run("synthetic", "--samples", "100", "--shape", "2x3", "--classes", "4",
                 "--out", str(tmp_path / "s.h5"))
    assert result.returncode == 0, result.stderr
    with HDF5Dataset(tmp_path / "s.h5") as data:
        assert (len(data), data.sample_shape, data.num_classes) == (100, (2, 3), 4)
    result = run("synthetic", "--samples", "10", "--shape", "0x3", "--out", str(tmp_path / "x"))
    assert result.returncode == 2 and "bad sample shape" in result.stderr


def test_bad_data_is_found_before_torch_is_imported(tmp_path):
    # `hpctrain train` runs these checks before it imports torch (1.4 s of CPU in every rank
    # of a launch that then only prints a verdict); build must stay importable without it.
    code = ("import sys; from hpctrain.train import TrainConfig, build; "
            "from hpctrain.errors import UsageError\n"
            f"config = TrainConfig(data={str(tmp_path / 'nothing.h5')!r})\n"
            "try:\n    build.check_without_torch(config, 0, 2)\n"
            "except UsageError as exc:\n    print(exc)\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.splitlines() == [
        f"data file {str(tmp_path / 'nothing.h5')!r} does not exist (prepare one with 'hpctrain "
        f"data prepare digits' or 'hpctrain data synthetic')", "False"], done.stdout + done.stderr


def test_the_checks_before_torch_stop_where_torch_or_a_collective_is_needed(tmp_path,
                                                                               monkeypatch):
    # A checkpoint to resume (torch.load), an --elastic run (it resumes one), a torch dataset
    # and the digits file that start-up prepares (a barrier) come before the data checks in
    # train's order, or replace them: the early checks leave those to train.
    from hpctrain.train import TrainConfig, build

    def opened(*args):
        raise AssertionError("the data file was opened")

    monkeypatch.setattr(build, "HDF5Dataset", opened)
    missing = str(tmp_path / "nothing.h5")
    for config in (TrainConfig(data=missing, resume="auto"), TrainConfig(data=missing,
                                                                        elastic=True),
                   TrainConfig(data=missing, dataset="mymodule:data"),
                   TrainConfig(data=str(tmp_path / "digits.h5"))):
        build.check_without_torch(config, 0, 2)
    with pytest.raises(UsageError, match="needs at least 2 ranks"):
        build.check_without_torch(TrainConfig(data=missing, regime="async-server"), 0, 1)
