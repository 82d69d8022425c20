"""A training script written for Horovod; only its import line names hpctrain.

    mpirun -np 4 python examples/horovod_style.py                        # hpctrain's ring
    HPCTRAIN_ALLREDUCE=tree mpirun -np 4 python examples/horovod_style.py
    HPCTRAIN_ALLREDUCE=horovod mpirun -np 4 python examples/horovod_style.py  # real Horovod

It trains a small MLP on scikit-learn's handwritten digits (bundled, no download) the way
Horovod's examples do: a DistributedSampler per rank, the learning rate scaled by the
number of ranks, rank 0's weights and optimizer state broadcast, a DistributedOptimizer,
and metrics averaged with allreduce. Put back ``import horovod.torch as hvd`` and it runs
under Horovod unchanged.
"""

import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hpctrain.torch as hvd     # was: import horovod.torch as hvd


def datasets():
    """Train and test splits of the 8x8 digits, scaled to [0, 1]."""
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    cut = int(0.8 * len(x))
    return TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:])


def metric_average(value, name):
    """The average of ``value`` over all ranks."""
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(42)
    torch.set_num_threads(1)
    train_set, test_set = datasets()
    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                      shuffle=False)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler)

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         op=hvd.Average)

    for epoch in range(args.epochs):
        model.train()
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        model.eval()
        correct, total = 0.0, 0.0
        with torch.no_grad():
            for x, y in test_loader:
                correct += (model(x).argmax(1) == y).sum().item()
                total += len(y)
        accuracy = metric_average(correct / max(total, 1), "accuracy")
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}  test accuracy "
                  f"{100 * accuracy:.2f}%", flush=True)
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    same = hvd.allgather_object(weights.sum().item())
    if hvd.rank() == 0:
        print(f"ranks {hvd.size()}, replicas identical: {len(set(same)) == 1}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
