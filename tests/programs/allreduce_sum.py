"""Every rank contributes rank + 1 to a Sum allreduce of hpctrain.torch; rank 0 prints what it
got, and the job exits non-zero where any rank got another sum than 1 + 2 + ... + size.

    mpirun -np 2 python tests/programs/allreduce_sum.py [ALGORITHM]
"""

import sys

import torch

import hpctrain.torch as hvd

hvd.init(allreduce=sys.argv[1] if len(sys.argv) > 1 else "ring")
got = hvd.allreduce(torch.full((5,), float(hvd.rank() + 1)), op=hvd.Sum, name="sum")
want = hvd.size() * (hvd.size() + 1) / 2
if hvd.rank() == 0:
    print(f"allreduce over {hvd.size()} ranks: {got.tolist()}, want {want}", flush=True)
right = bool((got == want).all())
hvd.shutdown()
sys.exit(0 if right else 1)
