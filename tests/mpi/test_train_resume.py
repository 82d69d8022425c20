"""Resuming from a checkpoint reproduces the uninterrupted run (under mpirun, every N)."""

import dataclasses

import pytest
import torch
from mpi4py import MPI

from hpctrain.train import TrainConfig, checkpoint, train

from conftest import SyntheticData

pytestmark = pytest.mark.mpi

#: conftest's data_file: 96 training rows, 6 steps per epoch of batch 4 per rank at N = 4:
#: step 5 is in the first epoch at every N.
DATA = SyntheticData(rows=120, shape=(1, 4, 4), classes=4, seed=2, noise=1.5)


@pytest.fixture
def config(comm, data_file, tmp_path):
    run_dir = comm.bcast(str(tmp_path), root=0)
    return TrainConfig(data=str(data_file), run_dir=f"{run_dir}/whole", hidden=12, epochs=3,
                       batch_size=4, lr=0.05, warmup_epochs=1.0, progress="never",
                       checkpoint_every="0", bucket_mb=200 / 2**20)


def same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("regime, algo, every", [
    ("allreduce", "ring", "3 steps"), ("allreduce", "butterfly", "1"),
    ("sharded-server", "ring", "2 steps"), ("server", "ring", "1"), ("allreduce", "horovod", "1"),
])
def test_resume_reproduces_the_uninterrupted_run(comm, config, regime, algo, every):
    config = dataclasses.replace(config, regime=regime, allreduce=algo)
    whole = train(config, comm)
    steps_per_epoch = whole.step // config.epochs
    # Stop one step after a checkpoint inside the second epoch, then resume from it.
    stop = steps_per_epoch + 2 if "steps" in every else steps_per_epoch + 1
    broken = dataclasses.replace(config, run_dir=config.run_dir.replace("whole", "broken"),
                                 checkpoint_every=every, max_steps=stop)
    train(broken, comm)
    resumed = train(dataclasses.replace(broken, max_steps=0, resume="auto"), comm)
    assert resumed.step == whole.step
    assert comm.allreduce(same(resumed.state, whole.state), op=MPI.LAND)
    assert len(resumed.history) == config.epochs - 1  # epochs 2 and 3, after the resume


def test_checkpoint_holds_position_step_and_rank_count(comm, config):
    config = dataclasses.replace(config, allreduce="ring", epochs=1, checkpoint_every="5 steps",
                                 max_steps=5)
    train(config, comm)
    saved = checkpoint.load(config.run_path / "checkpoint.pt") if comm.rank == 0 else None
    saved = comm.bcast(saved and {k: saved[k] for k in ("sampler", "step", "world_size")})
    assert saved == {"sampler": {"epoch": 0, "batch": 5, "start": 0}, "step": 5,
                     "world_size": comm.size}
