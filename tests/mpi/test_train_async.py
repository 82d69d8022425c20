"""The asynchronous parameter server: it trains, reports staleness, and ends consistently."""

import math

import pytest

from hpctrain.errors import UsageError
from hpctrain.train import TrainConfig, train

from conftest import SyntheticData

pytestmark = pytest.mark.mpi

#: conftest's data_file: 320 training rows, which the step count below is made of.
DATA = SyntheticData(rows=400, shape=(16,), classes=4, seed=5, noise=1.0)


@pytest.fixture
def config(comm, data_file, tmp_path):
    run_dir = comm.bcast(str(tmp_path), root=0)
    return TrainConfig(data=str(data_file), run_dir=run_dir, regime="async-server", hidden=16,
                       epochs=2, batch_size=8, lr=0.05, progress="never")


@pytest.mark.mpi(min_size=2)
def test_async_server_trains_and_reports_staleness(comm, config):
    result = train(config, comm)
    workers = comm.size - 1
    per_worker = -(-320 // (8 * workers))
    assert result.step == config.epochs * per_worker * workers  # every push applied once
    last = result.history[-1]
    assert last["val_acc"] > 0.5           # four classes: chance is 0.25
    assert last["staleness_max"] >= 0 and not math.isnan(last["staleness_mean"])
    if workers == 1:
        assert last["staleness_max"] == 0  # a lone worker never misses an update


def test_async_on_one_rank_is_a_usage_error_on_every_rank(comm, config):
    if comm.size > 1:
        pytest.skip("only one rank has no worker")
    with pytest.raises(UsageError, match="needs at least 2 ranks"):
        train(config, comm)
