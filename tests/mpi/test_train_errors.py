"""Bad input ends every rank with an error, never a hang (under mpirun, every N)."""

import dataclasses

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.errors import UsageError, Verdict
from hpctrain.train import TrainConfig, train

from conftest import SyntheticData

pytestmark = pytest.mark.mpi

#: conftest's data_file: 60 rows, 48 for training: no batch of 100 fits, and a validation
#: fraction of 0.995 leaves none.
DATA = SyntheticData(rows=60, shape=(6,), classes=3, seed=1)


@pytest.fixture
def config(comm, data_file, tmp_path):
    run_dir = comm.bcast(str(tmp_path), root=0)
    return TrainConfig(data=str(data_file), run_dir=run_dir, hidden=8, epochs=1, batch_size=4,
                       allreduce="ring", progress="never", checkpoint_every="0")


def raises_everywhere(comm, config, error, match):
    with pytest.raises(error, match=match):
        train(config, comm)
    return comm.allreduce(True, op=MPI.LAND)  # every rank got here: nobody hangs


@pytest.mark.parametrize("change, match", [
    ({"y": "labels"}, "no dataset 'labels'"),
    ({"data": "no/such/file.h5"}, "does not exist"),
    ({"batch_size": 100, "drop_last": True}, "leaves no batch"),
])
def test_bad_input_raises_usage_error_on_every_rank(comm, config, change, match):
    assert raises_everywhere(comm, dataclasses.replace(config, **change), UsageError, match)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("regime", ["allreduce", "server", "sharded-server", "async-server"])
def test_ranks_with_different_models_fail_together(comm, config, regime):
    # Only the last rank builds another model: the servers' bucket check, or the initial
    # broadcast's layout check, catches it before any collective could pair buffers of
    # different sizes, with one Verdict that names the rank.
    hidden = 9 if comm.rank == comm.size - 1 else 8
    config = dataclasses.replace(config, hidden=hidden, regime=regime)
    assert raises_everywhere(comm, config, Verdict,
                             rf"do all ranks build the same model\? "
                             rf"\(rank {comm.size - 1} of {comm.size}\)")


@pytest.mark.mpi(min_size=2)
def test_ranks_that_resume_different_checkpoints_fail_together(comm, config):
    # --resume auto over a run directory that is not shared: the last rank finds no
    # checkpoint and would start anew while the others resume.
    last = comm.rank == comm.size - 1
    first = dataclasses.replace(config, run_dir=f"{config.run_dir}/{'last' if last else 'all'}",
                                checkpoint_every="1")
    others = comm.Split(int(last))
    if not last:
        train(first, others)
    others.Free()
    comm.Barrier()
    resumed = dataclasses.replace(first, epochs=2, resume="auto")
    assert raises_everywhere(comm, resumed, Verdict,
                             rf"a start other than rank 0's .*: is the run directory on a file "
                             rf"system all ranks share\? \(rank {comm.size - 1} of "
                             rf"{comm.size}\)")


def _bad_files(root):
    (root / "text.h5").write_text("not hdf5")
    with h5py.File(root / "uneven.h5", "w") as f:
        f["x"], f["y"] = np.zeros((10, 6), np.float32), np.zeros(9, np.int64)
    with h5py.File(root / "empty.h5", "w") as f:
        f["x"], f["y"] = np.zeros((0, 6), np.float32), np.zeros(0, np.int64)
    (root / "checkpoint.pt").write_bytes(b"hpctrain-checkpoint {\"format\": 2, \"bytes\": 99, "
                                         b"\"sha256\": \"0\"}\nshort")


@pytest.mark.parametrize("change, match", [
    ({"data": "{root}/text.h5"}, "is not a readable HDF5 file"),
    ({"data": "{root}/uneven.h5"}, "with equal rows"),
    ({"data": "{root}/empty.h5"}, "holds no samples"),
    ({"val_fraction": 0.995}, "--val-fraction 0.995 leaves no training rows"),
    ({"resume": "{root}/checkpoint.pt"}, "is truncated: it holds 5 of 99 bytes"),
    ({"resume": "auto", "run_dir": "{root}"}, "no intact checkpoint in"),
])
def test_bad_files_raise_on_every_rank(comm, config, tmp_path, change, match):
    root = comm.bcast(str(tmp_path), root=0)
    if comm.rank == 0:
        _bad_files(tmp_path)
    comm.Barrier()
    change = {k: v.format(root=root) if isinstance(v, str) else v for k, v in change.items()}
    assert raises_everywhere(comm, dataclasses.replace(config, **change), UsageError, match)
