"""Each rank prints one line: its rank, its host and the variables named on the command line
(``-`` for one it lacks), so a test sees what its launcher handed to the ranks on each host.

    hpctrain-horovodrun -np 2 --cycle-time-ms 5 python tests/programs/show_env.py HOROVOD_CYCLE_TIME
"""

import os
import socket
import sys

# The launcher's variables, read without starting MPI: this program checks the launch only.
rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", "?"))
seen = " ".join(f"{name}={os.environ.get(name, '-')}" for name in sys.argv[1:])
# One write per rank, so that two ranks' lines never interleave in mpirun's output.
os.write(1, f"<rank {rank} on {socket.gethostname()}: {seen}>\n".encode())
