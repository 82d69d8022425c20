"""One rank SIGKILLs itself; the others must notice, revoke, shrink and allreduce without it.

    mpirun --with-ft ulfm -np N python tests/programs/ulfm_shrink.py [VICTIM]

Needs mpi4py built against an MPI with ULFM (``scripts/setup --ft``). Every survivor prints
when and how its barrier failed, and the new rank 0 prints the shrunken world's size and its
allreduce of ``world rank + 1``: integers, so the sum is exact in any order. A survivor that
gets another size or sum exits 1; the victim prints when it dies. scripts/setup's last check
and tests/test_ft_stack.py run it.
"""

import os
import signal
import sys
import time

import numpy as np

# Open MPI 5.0's MPI_Finalize ends with a PMIx fence over the whole job, which after a rank's
# death now and then never completes: the survivors wait in ompi_mpi_finalize for ever (3 of
# about 85 runs here; none in 250 without the fence). They agree on the world they finish
# with (the shrink, then their allreduce), so the fence adds nothing: leave it out.
os.environ.setdefault("OMPI_MCA_async_mpi_finalize", "1")
from mpi4py import MPI  # noqa: E402 - MPI_Init reads the setting above

world = MPI.COMM_WORLD
victim = int(sys.argv[1]) if len(sys.argv) > 1 else world.size - 1
# Our own communicator: revoking it leaves COMM_WORLD to MPI_Finalize.
comm = world.Dup()


def barrier_error():
    """The error of a barrier on ``comm``, or None when it completes."""
    try:
        comm.Barrier()
    except MPI.Exception as error:
        return error
    return None


# Everyone is up before anyone dies. The victim leaves this barrier as soon as it has
# completed there, and may die while a slower rank is still inside it: there it fails too.
error = barrier_error()
if comm.rank == victim:
    print(f"rank {victim}: SIGKILL at t={time.time():.6f}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

# The victim never comes. Without ULFM (no --with-ft ulfm) mpirun ends the job here; with it
# this barrier fails on every survivor, with PROC_FAILED where the failure was seen first and
# REVOKED where another survivor's revoke arrived before that.
error = error or barrier_error()
if error is None:
    print(f"rank {world.rank}: the barrier without rank {victim} succeeded", flush=True)
    sys.exit(1)
seen = time.time()
kind = {MPI.ERR_PROC_FAILED: "PROC_FAILED",
        MPI.ERR_REVOKED: "REVOKED"}.get(error.Get_error_class(), error.Get_error_string())
print(f"rank {world.rank}: barrier failed with {kind} at t={seen:.6f}", flush=True)

comm.Revoke()       # the others may still wait in the barrier: interrupt them
survivors = comm.Shrink()
failed = comm.Get_failed().Translate_ranks(None, world.Get_group())
got = np.zeros(4)
survivors.Allreduce(np.full(4, world.rank + 1.0), got, op=MPI.SUM)
want = world.size * (world.size + 1) / 2 - (victim + 1)
right = survivors.size == world.size - 1 and bool((got == want).all())
if survivors.rank == 0:
    print(f"shrunk to {survivors.size} ranks without {sorted(failed)}; "
          f"allreduce {got.tolist()}, want {want}", flush=True)
survivors.Free()
sys.exit(0 if right else 1)
