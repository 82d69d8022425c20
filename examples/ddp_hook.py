"""A PyTorch DDP script whose gradient allreduce is hpctrain's, through a comm hook.

    mpirun -np 4 python examples/ddp_hook.py                           # hpctrain's ring
    HPCTRAIN_ALLREDUCE=butterfly mpirun -np 4 python examples/ddp_hook.py

Ranks come from MPI: ``hvd.init()`` starts hpctrain.torch over ``COMM_WORLD`` and
``hvd.init_process_group()`` sets up DDP's gloo process group from it (rank 0 serves the
rendezvous store on a port it announces over MPI: no MASTER_ADDR or MASTER_PORT). DDP keeps
its buckets and its overlap with backward; ``register_comm_hook`` hands each bucket to the
algorithm chosen at ``init``.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import hpctrain.torch as hvd


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    hvd.init()
    hvd.init_process_group()
    torch.set_num_threads(1)
    torch.manual_seed(0)          # the same weights everywhere; DDP broadcasts rank 0's too
    model = DistributedDataParallel(nn.Sequential(nn.Linear(20, 64), nn.ReLU(),
                                                  nn.Linear(64, 4)), bucket_cap_mb=0.01)
    model.register_comm_hook(None, hvd.comm_hook())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1 + hvd.rank())    # each rank its own data
    teacher = torch.Generator().manual_seed(99)
    w = torch.randn(20, 4, generator=teacher)
    for _ in range(args.steps):
        x = torch.randn(16, 20, generator=gen)
        y = (x @ w).argmax(1)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    sums = hvd.allgather_object([p.detach().sum().item() for p in model.parameters()])
    if hvd.rank() == 0:
        print(f"ranks {hvd.size()}, algorithm {hvd.algorithm()}, last loss {loss.item():.4f}, "
              f"replicas identical: {all(s == sums[0] for s in sums)}", flush=True)
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
