"""A Horovod-style script that fails on one rank: every rank says it started, then rank
RANK (default 1) raises a RuntimeError while the others wait for it in an allreduce, which
hpctrain's guard (``hvd.init()``) turns into the end of the job.

    mpirun -np 4 python tests/programs/fail_on_rank.py [RANK]
"""

import sys

import torch

import hpctrain.torch as hvd

hvd.init()
bad = int(sys.argv[1]) if len(sys.argv) > 1 else 1
print(f"rank {hvd.rank()} of {hvd.size()} started", flush=True)
if hvd.rank() == bad:
    raise RuntimeError(f"rank {bad} fails on purpose")
hvd.allreduce(torch.ones(1), name="never complete")
