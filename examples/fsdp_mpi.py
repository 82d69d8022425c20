"""PyTorch FSDP2 (``fully_shard``) over MPI: the ``hpctrain`` backend of torch.distributed.

    mpirun -np 4 python examples/fsdp_mpi.py                         # hpctrain's ring
    HPCTRAIN_ALLREDUCE=mpi mpirun -np 4 python examples/fsdp_mpi.py
    sbatch -N 2 --ntasks-per-node 2 jobs/run.sbatch examples/fsdp_mpi.py
    mpirun -np 2 python examples/fsdp_mpi.py --device cuda           # one GPU per local rank

Each rank holds a shard of every parameter; FSDP2 all-gathers a layer's parameters before
it runs (``all_gather_into_tensor``) and reduce-scatters its gradients after backward
(``reduce_scatter_tensor``), both on hpctrain's algorithms. The script names hpctrain twice:
``import hpctrain.torch.distributed`` and ``dist.init_process_group("hpctrain")``. Data and
model as examples/ddp_mpi.py; rank 0 prints the test accuracy.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddp_mpi import accuracy, datasets, local_device
from torch.distributed.device_mesh import init_device_mesh
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import hpctrain.torch.distributed  # noqa: F401 - registers the "hpctrain" backend

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:     # torch 2.5: FSDP2 was not public yet
    from torch.distributed._composable.fsdp import fully_shard


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()

    dist.init_process_group("hpctrain")
    rank, size = dist.get_rank(), dist.get_world_size()
    device = local_device(args.device)
    # Named, not left to fully_shard: its default mesh is CUDA's wherever a GPU exists.
    mesh = init_device_mesh(device.type, (size,))
    torch.manual_seed(42)
    torch.set_num_threads(1)
    train_set, test_set = datasets()
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)   # one all-gather and one reduce-scatter per layer
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        score = accuracy(model, test_set, device)
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}  test accuracy "
                  f"{100 * score:.2f}%", flush=True)
    shard = sum(p.to_local().numel() for p in model.parameters())
    if rank == 0:
        print(f"ranks {size}, backend {dist.get_backend()}, algorithm "
              f"{hpctrain.torch.algorithm()}, device {device.type}, parameters held by rank 0: "
              f"{shard} of "
              f"{sum(p.numel() for p in model.parameters())}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
