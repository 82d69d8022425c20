"""Data-parallel equivalence: N ranks with batch b reach the weights of 1 rank with batch N·b.

Run under mpirun at every N: ``mpirun -np N python -m pytest --with-mpi tests/mpi``. Each
test trains a few steps with one ``--allreduce`` (or regime) over COMM_WORLD, while rank 0
also computes a reference in plain PyTorch, in this process and without MPI: one model,
batch N·b, the same global sample order. The mean loss makes the average of the ranks'
gradients equal to the big batch's gradient, so the weights agree to float rounding.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hpctrain.data import HDF5Dataset, split_indices, synthetic
from hpctrain.models import build_model
from hpctrain.sampler import DistributedSampler
from hpctrain.train import TrainConfig, train
from hpctrain.train.config import ALLREDUCE

from conftest import from_rank0

pytestmark = pytest.mark.mpi

CASES = [("allreduce", algo) for algo in ALLREDUCE] + [("ps", "ring"), ("ps-sharded", "ring")]
PER_RANK_BATCH = 3


@pytest.fixture(scope="module")
def data_file(comm, tmp_path_factory):
    # 40 rows, 30 for training: padded last batches at N = 3 and 4, exact at N = 2.
    return from_rank0(comm, lambda: synthetic.write(
        tmp_path_factory.mktemp("data") / "eq.h5", 40, (1, 3, 3), 3, seed=7, noise=0.5))


@pytest.fixture
def config(comm, data_file, tmp_path):
    run_dir = comm.bcast(str(tmp_path), root=0)
    # Tiny buckets (~100 bytes) give several buckets, so bucket order and overlap matter.
    return TrainConfig(data=str(data_file), run_dir=run_dir, hidden=8, epochs=2,
                       batch_size=PER_RANK_BATCH, val_fraction=0.25, lr=0.1, momentum=0.9,
                       weight_decay=0.01, lr_scaling="none", warmup_epochs=0.0,
                       lr_decay="none", checkpoint_every="0", progress="never",
                       bucket_mb=100 / 2**20)


def reference_weights(config, size):
    """One process, batch ``size × b``, plain SGD: what N ranks must reproduce."""
    with HDF5Dataset(config.data) as data:
        rows, _ = split_indices(len(data), config.val_fraction, config.split_seed)
        sampler = DistributedSampler(len(rows), config.batch_size * size, 0, 1,
                                     seed=config.seed)
        model = build_model(config.model, data.sample_shape, data.num_classes,
                            hidden=config.hidden, seed=config.seed)
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                                    weight_decay=config.weight_decay)
        for epoch in range(config.epochs):
            sampler.set_epoch(epoch)
            for positions in sampler:
                x, y = data.read(rows[positions])
                optimizer.zero_grad()
                F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
                optimizer.step()
    return model.state_dict()


def agree(result, reference, tolerance):
    return all(torch.allclose(result[k], reference[k], rtol=tolerance, atol=tolerance)
               for k in reference)


@pytest.mark.parametrize("regime, algo", CASES, ids=[f"{r}-{a}" for r, a in CASES])
def test_n_ranks_match_one_rank_with_the_global_batch(comm, config, regime, algo):
    config = dataclasses.replace(config, regime=regime, allreduce=algo)
    if algo == "auto":
        # A profile that picks a different algorithm for small, middle and large buckets.
        profile = f"{config.run_dir}/params.json"
        if comm.rank == 0:
            best = {str(comm.size): [[8, "tree"], [64, "butterfly"], [512, "ring"]]}
            params = {"alpha": 1e-6, "beta": 1e-9, "gamma": 1e-10}
            Path(profile).write_text(json.dumps({"fitted": params, "p2p_prior": params,
                                                 "measured_best": best}))
        config = dataclasses.replace(config, allreduce_profile=profile)
    result = train(config, comm)
    ok = None
    if comm.rank == 0:
        reference = reference_weights(config, comm.size)
        # float32 sums in another order: error grows with the ranks and the steps taken.
        ok = agree(result.state, reference, tolerance=1e-6 * comm.size)
        if not ok:
            worst = max((result.state[k] - reference[k]).abs().max().item() for k in reference)
            print(f"{regime}/{algo}: largest difference {worst:.3g}")
    assert comm.bcast(ok, root=0)
    steps = 2 * -(-30 // (PER_RANK_BATCH * comm.size))
    assert result.step == steps


def test_each_rank_reads_a_disjoint_share_of_every_global_batch(comm, config):
    """The ranks' rows of each step are disjoint and make up the global batch."""
    with HDF5Dataset(config.data) as data:
        rows, _ = split_indices(len(data), config.val_fraction, config.split_seed)
    sampler = DistributedSampler(len(rows), PER_RANK_BATCH, comm.rank, comm.size, seed=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        mine = [rows[p] for p in sampler]
        everyone = comm.allgather(mine)
        steps = {len(batches) for batches in everyone}
        assert steps == {len(mine)}
        for step in range(len(mine)):
            together = np.concatenate([batches[step] for batches in everyone])
            big = rows[sampler.global_order(epoch)[step * sampler.global_batch_size:
                                                   (step + 1) * sampler.global_batch_size]]
            assert np.array_equal(together, big)
        seen = np.concatenate([b for batches in everyone for b in batches])
        assert set(seen.tolist()) == set(rows.tolist())
        assert len(seen) - len(rows) == sampler.padding
