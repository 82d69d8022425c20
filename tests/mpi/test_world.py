"""Run under mpirun: ``mpirun -np N python -m pytest --with-mpi -m mpi tests/mpi``."""

import numpy as np
import pytest

from conftest import all_ranks
from hpctrain import info, runtime

pytestmark = pytest.mark.mpi


def test_launcher_rank_matches_mpi(comm):
    launcher_rank = runtime.launcher_rank()
    all_ranks(comm, launcher_rank == comm.rank, [f"launcher rank {launcher_rank}"])


def test_describe_rank_gathers_one_entry_per_rank(comm):
    ranks = comm.gather(info.describe_rank(comm), root=0)
    ok = ranks is None or [r["rank"] for r in ranks] == list(range(comm.size))
    all_ranks(comm, ok, [] if ok else [f"gathered ranks {[r['rank'] for r in ranks]}"])


def test_mpi4py_allreduce_of_rank_numbers(comm):
    buf = np.full(5, comm.rank, dtype=np.int64)
    out = np.empty_like(buf)
    comm.Allreduce(buf, out)
    ok = bool((out == comm.size * (comm.size - 1) // 2).all())
    all_ranks(comm, ok, [] if ok else [f"Allreduce gave {out.tolist()}"])


def test_horovod_runs_over_the_same_world(comm):
    import horovod.torch as hvd
    import torch

    hvd.init()
    # Every rank reaches the allreduce whatever it found before: an assertion failing there
    # on one rank would leave the others waiting in it. One collective verdict at the end.
    failures = []
    if (hvd.size(), hvd.rank()) != (comm.size, comm.rank):
        failures.append(f"Horovod size, rank {hvd.size(), hvd.rank()}")
    if not hvd.mpi_enabled():
        failures.append("Horovod's MPI controller is not enabled")
    total = hvd.allreduce(torch.tensor([float(comm.rank), 1.0]), op=hvd.Sum, name="ranks")
    if total.tolist() != [comm.size * (comm.size - 1) / 2, float(comm.size)]:
        failures.append(f"allreduce gave {total.tolist()}")
    all_ranks(comm, not failures, failures)

