"""``allreduce(algo="auto")`` under MPI: correct, the profile's choice, errors everywhere."""

import json

import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.collectives import allreduce, auto, context, cost
from hpctrain.errors import UsageError

from conftest import all_ranks

pytestmark = pytest.mark.mpi


@pytest.fixture
def profile_path(tmp_path_factory):
    comm = MPI.COMM_WORLD
    path = None
    if comm.rank == 0:
        path = tmp_path_factory.mktemp("profile") / "params.json"
        best = {str(comm.size): [[64, "tree"], [1 << 20, "ring"]]}
        path.write_text(json.dumps({"fitted": {"alpha": 1e-6, "beta": 1e-9, "gamma": 1e-10},
                                    "p2p_prior": {"alpha": 1e-6, "beta": 1e-9, "gamma": 0},
                                    "measured_best": best}))
    return comm.bcast(str(path), root=0)


def test_auto_reduces_with_the_profiles_choice(profile_path):
    comm = MPI.COMM_WORLD
    auto.use(auto.load(profile_path, comm))
    failures = []
    for count, chosen in ((4, "tree"), (1 << 18, "ring")):
        data = np.arange(count, dtype=np.float64) + comm.rank
        allreduce(data, op="sum", algo="auto")
        want = comm.size * np.arange(count, dtype=np.float64) + comm.size * (comm.size - 1) / 2
        plans = [p for k, p in context().plans.items() if k[0] == auto.ACTIVE.name
                 and k[3] == count]
        if not np.array_equal(data, want):
            failures.append(f"n={count}: wrong result")
        if auto.choice(count * 8, comm.size)[0] != chosen:
            failures.append(f"n={count}: the profile chose {auto.choice(count * 8, comm.size)}")
        if not plans or plans[0].algorithm.name != chosen:
            failures.append(f"n={count}: ran {[p.algorithm.name for p in plans]}, not {chosen}")
    all_ranks(comm, not failures, failures)


def test_a_new_profile_takes_effect_at_the_next_call(profile_path, tmp_path):
    comm = MPI.COMM_WORLD
    auto.use(auto.load(profile_path, comm))
    data = np.ones(4)
    allreduce(data, algo="auto")
    first = auto.ACTIVE.name
    auto.use(auto.Profile(cost.Params(1e-6, 1e-9, 0.0), best={comm.size: ((8, "butterfly"),)}))
    allreduce(data, algo="auto")
    plans = [p.algorithm.name for k, p in context().plans.items() if k[0] == auto.ACTIVE.name]
    all_ranks(comm, auto.ACTIVE.name != first and plans == ["butterfly"]
              and data[0] == comm.size ** 2, [f"plans {plans}, data {data.tolist()}"])


def test_a_missing_profile_fails_on_every_rank():
    with pytest.raises(UsageError, match="no profile at 'no/such/params.json'"):
        auto.load("no/such/params.json", MPI.COMM_WORLD)
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.size   # nobody is left waiting
