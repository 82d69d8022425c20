"""A float64 model trains in float64 under every parameter-server regime.

Run under mpirun at every N: ``mpirun -np N python -m pytest --with-mpi tests/mpi``. The model
comes from a ``--model package.module:factory`` plug-in (:func:`float64_mlp`, defined here)
whose parameters are float64; the data file holds float32 samples, which the loop casts to
the model's dtype. ``--regime server`` and ``--regime sharded-server`` must reach the weights of
``--regime allreduce`` (ring) on the same batches: they sum the same gradients in another
order, so they agree to a few float64 roundings, far below float32's precision. A
gradient or weight that travelled as float32 anywhere would miss that tolerance by orders of
magnitude (and ``MPI.FLOAT`` counts on a float64 buffer gather only half the bytes).
"""

import dataclasses

import numpy as np
import pytest
import torch

from hpctrain.models import mlp
from hpctrain.train import train

from conftest import PER_RANK_BATCH, all_ranks

pytestmark = pytest.mark.mpi

EPSILON = float(np.finfo(np.float64).eps)


def float64_mlp(sample_shape, classes):
    """The project's MLP with float64 parameters: the ``--model`` plug-in of these tests."""
    return mlp.build(sample_shape, classes, hidden=8).to(torch.float64)


@pytest.fixture
def config(config):
    """tests/conftest.py's run (30 training rows of its data_file, tiny buckets: several
    buckets and shards of uneven sizes) with the float64 model of :func:`float64_mlp`."""
    return dataclasses.replace(config, model=f"{__name__}:float64_mlp")


def tolerance(size, steps):
    """float64 rounding of sums in another order, growing with the ranks and the steps."""
    return 16 * EPSILON * size * steps


def differences(result, reference, tol):
    """One line per tensor that is not float64 or differs from ``reference`` beyond ``tol``."""
    failures = []
    for name, expected in reference.items():
        got = result[name]
        if got.dtype != torch.float64:
            failures.append(f"{name}: dtype {got.dtype}, not torch.float64")
        elif not torch.allclose(got, expected, rtol=tol, atol=tol):
            worst = (got - expected).abs().max().item()
            failures.append(f"{name}: largest difference {worst:.3g} > {tol:.3g}")
    return failures


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("regime", ["server", "sharded-server"])
def test_float64_model_matches_allreduce_under_parameter_servers(comm, config, regime):
    reference = train(dataclasses.replace(config, regime="allreduce", allreduce="ring"), comm)
    result = train(dataclasses.replace(config, regime=regime, allreduce="ring"), comm)
    steps = 2 * -(-30 // (PER_RANK_BATCH * comm.size))
    assert reference.step == result.step == steps
    failures = differences(result.state, reference.state, tolerance(comm.size, steps))
    all_ranks(comm, not failures, failures)


@pytest.mark.mpi(min_size=2)
def test_float64_model_trains_under_the_asynchronous_server(comm, config):
    # Not deterministic (arrival order), so no reference: it must run and stay float64.
    result = train(dataclasses.replace(config, regime="async-server"), comm)
    failures = [f"{name}: dtype {t.dtype}" for name, t in result.state.items()
                if t.dtype != torch.float64]
    failures += [f"{name}: not finite" for name, t in result.state.items()
                 if not torch.isfinite(t).all()]
    all_ranks(comm, not failures, failures)
