"""A script that fails on one rank under hpctrain's guard (what ``hvd.init()`` installs):
every rank says it started, then rank RANK (default 1) raises a RuntimeError while the
others wait for it in a broadcast, which the guard turns into the end of the job.

    mpirun -np 4 python tests/programs/fail_on_rank.py [RANK]
"""

import sys

from mpi4py import MPI

from hpctrain.runtime import guard

guard()
comm = MPI.COMM_WORLD
bad = int(sys.argv[1]) if len(sys.argv) > 1 else 1
print(f"rank {comm.rank} of {comm.size} started", flush=True)
if comm.rank == bad:
    raise RuntimeError(f"rank {bad} fails on purpose")
comm.bcast(None, root=bad)
