"""Training when every rank holds a different amount of data: ``hvd.join``.

    mpirun -np 3 python examples/uneven_data.py
    HPCTRAIN_ALLREDUCE=tree mpirun -np 3 python examples/uneven_data.py

Rank r holds 40 + 13 r rows of a small synthetic classification set, so the ranks run out of
batches at different steps. Without ``hvd.join`` the rank with the most batches would wait
forever in its next gradient allreduce (a deadlock): a rank that has no more batches calls
``hvd.join()`` instead, and takes part in the others' allreduces with zeros until every rank
has joined. The average still divides by the number of ranks, as in Horovod.

``hvd.SyncBatchNorm`` works with join too: its statistics are sums over the ranks, to which
a joined rank adds zero rows. After the join every rank takes the model of the rank
that joined last. Validation counts (correct, total) are gathered with ``hvd.allgather``,
so the accuracy weighs every rank by its number of rows.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import hpctrain.torch as hvd

FEATURES, CLASSES = 8, 3


def rows_of(rank):
    """How many training rows rank ``rank`` holds: a different number on every rank."""
    return 40 + 13 * rank


def make_data(rows, seed):
    """``rows`` samples of the synthetic set: three Gaussian clouds, one per class."""
    centres = 1.2 * torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (rows,), generator=gen)
    return centres[labels] + torch.randn(rows, FEATURES, generator=gen), labels


def checksum(model):
    """One number from every parameter and buffer: equal on ranks that hold the same model."""
    return sum(t.double().sum().item() for t in model.state_dict().values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    x, y = make_data(rows_of(rank), seed=100 + rank)           # this rank's own rows
    val_x, val_y = make_data(20 + 7 * rank, seed=200 + rank)
    batches = list(zip(x.split(args.batch_size), y.split(args.batch_size)))

    model = nn.Sequential(nn.Linear(FEATURES, 16), hvd.SyncBatchNorm(16), nn.ReLU(),
                          nn.Linear(16, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    steps = args.epochs * len(batches)          # this rank's own number of steps
    everyone = hvd.allgather(torch.tensor([steps]), name="steps").tolist()
    if rank == 0:
        print(f"ranks {size}, algorithm {hvd.algorithm()}, training rows per rank "
              f"{[rows_of(r) for r in range(size)]}, steps per rank {everyone}", flush=True)
    model.train()
    for _ in range(args.epochs):
        for inputs, labels in batches:
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
    # Out of batches: stand in with zeros for the ranks that still have some.
    last = hvd.join()
    if rank == 0:
        print(f"rank {last} joined last", flush=True)
    # A joined rank skipped the others' last updates: take the model (weights and running
    # statistics) of the rank that joined last. Ranks that took different numbers of steps
    # have made different numbers of unnamed collectives (SyncBatchNorm's backward pass makes
    # some), so after a join only named ones pair up: name each broadcast (not
    # hvd.broadcast_parameters, whose operation is unnamed here).
    for name, tensor in sorted(model.state_dict().items()):
        hvd.broadcast_(tensor, root_rank=last, name=f"final.{name}")

    model.eval()
    with torch.no_grad():
        correct = (model(val_x).argmax(1) == val_y).sum().item()
    counts = hvd.allgather(torch.tensor([[correct, len(val_y)]]), name="validation")
    sums = hvd.allgather(torch.tensor([checksum(model)], dtype=torch.float64), name="checksum")
    if rank == 0:
        right, total = counts.sum(0).tolist()
        print(f"validation accuracy {100 * right / total:.1f}% ({right} of {total}; per rank "
              f"{counts.tolist()})", flush=True)
        print(f"weight checksum per rank {sums.tolist()}; replicas identical: "
              f"{len(set(sums.tolist())) == 1}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
