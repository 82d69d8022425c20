"""NaN/Inf steps, diverged replicas and the watchdog's clean-up, in-process under mpirun at
every N. The faults come from ``HPCTRAIN_FAULT``, set alike on every rank; the last rank is
the faulty one. (Whole-job behaviour, with exit codes and times: tests/test_faults.py.)"""

import dataclasses
import threading

import pytest
import torch
from mpi4py import MPI

from hpctrain import faults
from hpctrain.errors import Verdict
from hpctrain.train import TrainConfig, train
from hpctrain.train.nonfinite import NonFiniteError

from conftest import SyntheticData, from_rank0

pytestmark = pytest.mark.mpi

REGIMES = [("allreduce", "ring"), ("allreduce", "horovod"), ("server", "ring"),
           ("sharded-server", "ring")]
#: conftest's data_file: 64 training rows, 4 steps per epoch of batch 4 per rank at N = 4:
#: step 4 is in epoch 1 at every N, and the run's 2 epochs reach the check at step 6.
DATA = SyntheticData(rows=80, shape=(6,), classes=3, seed=4, noise=1.5)


@pytest.fixture
def config(comm, data_file, tmp_path_factory):
    run_dir = from_rank0(comm, lambda: str(tmp_path_factory.mktemp("rel") / "run"))
    return TrainConfig(data=str(data_file), run_dir=run_dir, hidden=8, epochs=2, batch_size=4,
                       allreduce="ring", progress="never", checkpoint_every="0",
                       warmup_epochs=0.5)


@pytest.fixture
def fault(comm, monkeypatch):
    """``fault(spec)``: set HPCTRAIN_FAULT on every rank, hit counts starting from zero."""
    def arm(spec):
        faults.reset()
        monkeypatch.setenv(faults.ENV, spec.format(last=comm.size - 1))
    yield arm
    faults.reset()


def same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("regime, algo", REGIMES)
def test_a_skipped_update_changes_nothing_on_any_rank(comm, config, fault, regime, algo):
    config = dataclasses.replace(config, regime=regime, allreduce=algo, nonfinite="skip")
    before = train(dataclasses.replace(config, max_steps=2), comm)
    fault("train.loss@{last}#3:nan")
    skipped = train(dataclasses.replace(config, max_steps=3), comm)
    assert skipped.skipped == 1 and skipped.step == 3
    # Step 3's update was dropped everywhere: the weights are step 2's, bit for bit (and
    # train() itself checked them equal on every rank).
    assert comm.allreduce(same(skipped.state, before.state), op=MPI.LAND)


@pytest.mark.parametrize("regime, algo", REGIMES)
def test_training_goes_on_after_a_skipped_update(comm, config, fault, regime, algo):
    fault("train.grad@{last}#2:inf")
    result = train(dataclasses.replace(config, regime=regime, allreduce=algo,
                                       nonfinite="skip"), comm)
    assert result.skipped == 1
    assert all(torch.isfinite(t).all() for t in result.state.values())
    assert all(row["train_loss"] == row["train_loss"] for row in result.history)  # not NaN


@pytest.mark.parametrize("regime, algo", REGIMES)
def test_a_non_finite_loss_stops_every_rank(comm, config, fault, regime, algo):
    fault("train.loss@{last}#4:inf")
    with pytest.raises(NonFiniteError, match=rf"non-finite loss on rank\(s\) \[{comm.size - 1}\]"
                                             r".* at step 4 \(epoch 1\)"):
        train(dataclasses.replace(config, regime=regime, allreduce=algo), comm)
    assert comm.allreduce(True, op=MPI.LAND)  # every rank got here: nobody hangs
    assert not _watchdog_threads()


@pytest.mark.mpi(min_size=2)
def test_check_consistency_names_the_diverged_rank(comm, config, fault):
    fault("train.perturb@{last}#5:perturb")
    expected = (rf"model replicas differ at step 6 \(--check-consistency 3\): "
                rf"ranks \[{comm.size - 1}\]")
    with pytest.raises(RuntimeError, match=expected):
        train(dataclasses.replace(config, check_consistency=3), comm)
    assert comm.allreduce(True, op=MPI.LAND)


@pytest.mark.mpi(min_size=2)
def test_without_the_check_a_diverged_replica_is_caught_at_the_end(comm, config, fault):
    # What --check-consistency adds: without it the run trains on, diverged, to the end.
    fault("train.perturb@{last}#5:perturb")
    with pytest.raises(RuntimeError, match="model replicas differ at the end of training"):
        train(config, comm)


@pytest.mark.mpi(min_size=2)
def test_a_failed_start_stops_the_watchdog_thread(comm, config):
    # The last rank builds another model: every rank raises after the watchdog started.
    hidden = 9 if comm.rank == comm.size - 1 else 8
    with pytest.raises(Verdict, match="do all ranks build the same model"):
        train(dataclasses.replace(config, hidden=hidden), comm)
    assert comm.allreduce(not _watchdog_threads(), op=MPI.LAND)


def _watchdog_threads():
    return [t for t in threading.enumerate() if t.name == "hpctrain-watchdog" and t.is_alive()]
