"""PyTorch DistributedDataParallel over MPI: the ``hpctrain`` backend of torch.distributed.

    mpirun -np 4 python examples/ddp_mpi.py                          # hpctrain's ring
    HPCTRAIN_ALLREDUCE=butterfly mpirun -np 4 python examples/ddp_mpi.py
    srun -n 4 python examples/ddp_mpi.py
    mpirun -np 2 python examples/ddp_mpi.py --device cuda            # one GPU per local rank

A plain DDP script: ``import hpctrain.torch.distributed`` and
``dist.init_process_group("hpctrain")`` are the only lines that name hpctrain; no
MASTER_ADDR, MASTER_PORT, RANK or WORLD_SIZE (rank and size come from MPI). DDP keeps its own
buckets and its overlap with backward; every bucket's allreduce is hpctrain's algorithm. It
trains a small MLP on scikit-learn's handwritten digits (bundled, no download) with a
DistributedSampler; rank 0 prints the test accuracy and whether the replicas are identical.
With ``--device cuda`` each rank trains on the GPU of its node-local rank, and DDP's buckets
go to MPI as device buffers (a CUDA-aware MPI reads them in place; another is handed host
copies).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hpctrain.torch.distributed  # noqa: F401 - registers the "hpctrain" backend
from hpctrain.data.digits import load_arrays


def datasets():
    """Train and test splits of the 8x8 digits, flattened, in a fixed shuffled order."""
    x, y = (torch.from_numpy(a) for a in load_arrays())
    x = x.reshape(len(x), -1)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    cut = int(0.8 * len(x))
    return TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:])


def local_device(kind):
    """``cpu``, or the GPU of this rank's node-local rank (as the launchers give it: torchrun's
    ``LOCAL_RANK``, Open MPI's ``OMPI_COMM_WORLD_LOCAL_RANK``, Slurm's ``SLURM_LOCALID``),
    made the current one."""
    if kind == "cpu":
        return torch.device("cpu")
    local = next((os.environ[v] for v in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "SLURM_LOCALID") if os.environ.get(v)),
                 dist.get_rank())
    device = torch.device("cuda", int(local) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def accuracy(model, test_set, device="cpu"):
    """The test accuracy over every rank's share of ``test_set`` (an all_reduce)."""
    sampler = DistributedSampler(test_set, shuffle=False)
    counts = torch.zeros(2, device=device)
    with torch.no_grad():
        for x, y in DataLoader(test_set, batch_size=256, sampler=sampler):
            x, y = x.to(device), y.to(device)
            counts += torch.stack([(model(x).argmax(1) == y).sum().float(),
                                   torch.tensor(float(len(y)), device=device)])
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


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
    torch.manual_seed(42)
    torch.set_num_threads(1)
    train_set, test_set = datasets()
    sampler = DistributedSampler(train_set)      # rank and size from the default group
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device),
        device_ids=[device] if device.type == "cuda" else None)
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
    sums = [None] * size
    dist.all_gather_object(sums, sum(p.sum().item() for p in model.parameters()))
    if rank == 0:
        print(f"ranks {size}, backend {dist.get_backend()}, algorithm "
              f"{hpctrain.torch.algorithm()}, device {device.type}, replicas identical: "
              f"{len(set(sums)) == 1}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
