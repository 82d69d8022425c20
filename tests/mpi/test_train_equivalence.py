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

from hpctrain.data import HDF5Dataset, split_indices
from hpctrain.models import build_model
from hpctrain.sampler import GlobalBatchSampler
from hpctrain.train import train
from hpctrain.train.config import ALLREDUCE

from conftest import PER_RANK_BATCH

pytestmark = pytest.mark.mpi

CASES = [("allreduce", algo) for algo in ALLREDUCE] + [("server", "ring"),
                                                     ("sharded-server", "ring")]

# data_file and config are tests/conftest.py's: 40 rows, 30 for training, in steps of
# PER_RANK_BATCH rows per rank with nothing that depends on the number of ranks.


def reference_weights(config, size):
    """One process, batch ``size × b``, plain SGD: what N ranks must reproduce."""
    with HDF5Dataset(config.data) as data:
        rows, _ = split_indices(len(data), config.val_fraction, config.split_seed)
        sampler = GlobalBatchSampler(len(rows), config.batch_size * size, 0, 1,
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
    sampler = GlobalBatchSampler(len(rows), PER_RANK_BATCH, comm.rank, comm.size, seed=3)
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
