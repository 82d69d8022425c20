"""A job whose last rank is late to its third collective: `stall.py TIMEOUT DELAY`."""

import sys
import time

from mpi4py import MPI

from hpctrain.watchdog import StallWatchdog

comm = MPI.COMM_WORLD
timeout, delay = float(sys.argv[1]), float(sys.argv[2])
watchdog = StallWatchdog(comm, warning=1.0, timeout=timeout)
for step in range(3):
    if comm.rank == comm.size - 1 and step == 2:
        time.sleep(delay)
    watchdog.arrive(f"allreduce step {step}")
    comm.allreduce(step)
watchdog.close()
if comm.rank == 0:
    print("finished", flush=True)
