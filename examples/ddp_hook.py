"""A PyTorch DDP script whose gradient allreduce is hpctrain's, through a comm hook.

    mpirun -np 4 python examples/ddp_hook.py                           # hpctrain's ring
    HPCTRAIN_ALLREDUCE=butterfly mpirun -np 4 python examples/ddp_hook.py
    mpirun -np 4 python examples/ddp_hook.py --op sum                  # summed gradients

Ranks come from MPI: ``hvd.init()`` starts hpctrain.torch over ``COMM_WORLD`` and
``hvd.init_process_group()`` sets up DDP's gloo process group from it (rank 0 serves the
rendezvous store on a port it announces over MPI: no MASTER_ADDR or MASTER_PORT). DDP keeps
its buckets and its overlap with backward; ``register_comm_hook`` hands each bucket to the
algorithm chosen at ``init``.

Rank 0 prints what the hook reduced and checks the result against one process trained on
every rank's batches at once: with ``--op average`` (DDP's own rule) the same weights, with
``--op sum`` the weights of a loss ``size`` times larger, which DDP alone never computes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import hpctrain.torch as hvd

BATCH = 16          # rows per rank and step
# ~1 KB: DDP splits this model's 6.4 KB of gradients into several buckets (after its first
# step, when it rebuilds them in the order backward produced the gradients).
BUCKET_CAP_MB = 0.001
OPS = {"average": hvd.Average, "sum": hvd.Sum}


def make_model():
    torch.manual_seed(0)          # the same weights everywhere; DDP broadcasts rank 0's too
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))


def batches(rank, steps):
    """Rank ``rank``'s ``steps`` batches: its own inputs, labels from one shared teacher."""
    gen = torch.Generator().manual_seed(1 + rank)
    teacher = torch.randn(20, 4, generator=torch.Generator().manual_seed(99))
    xs = [torch.randn(BATCH, 20, generator=gen) for _ in range(steps)]
    return [(x, (x @ teacher).argmax(1)) for x in xs]


def train_alone(size, steps, scale):
    """One process, no DDP, on every rank's batch of each step: the weights the ranks must
    reach. The mean loss over all ranks' rows is the mean of the ranks' means (equal
    batches), so its gradient is what averaging the ranks' gradients gives; ``scale`` =
    ``size`` gives what summing them does."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    every = [batches(rank, steps) for rank in range(size)]
    for step in range(steps):
        x = torch.cat([mine[step][0] for mine in every])
        y = torch.cat([mine[step][1] for mine in every])
        optimizer.zero_grad()
        (scale * F.cross_entropy(model(x), y)).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--op", choices=sorted(OPS), default="average",
                        help="how the hook combines the ranks' gradients")
    args = parser.parse_args()

    hvd.init()
    hvd.init_process_group()
    torch.set_num_threads(1)
    model = DistributedDataParallel(make_model(), bucket_cap_mb=BUCKET_CAP_MB)
    hook = hvd.comm_hook(OPS[args.op])
    model.register_comm_hook(None, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    most = 0        # the most buckets the hook reduced in one step
    for x, y in batches(hvd.rank(), args.steps):
        before = hook.buckets
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()             # returns once every bucket's future has completed
        optimizer.step()
        most = max(most, hook.buckets - before)
    weights = [p.detach() for p in model.parameters()]
    sums = hvd.allgather_object([w.sum().item() for w in weights])
    if hvd.rank() == 0:
        report(args, loss, sums, hook, most, weights)
    dist.destroy_process_group()
    hvd.shutdown()


def report(args, loss, sums, hook, most, weights):
    """Rank 0's lines: the run, what the hook reduced, the check against one process."""
    size = hvd.size()
    alone = train_alone(size, args.steps, size if args.op == "sum" else 1)
    # The ranks' sum and one process's mean add the same numbers in other orders, so the
    # last bits differ: below 1e-7 after 20 steps at np 2..4. Gradients averaged where the
    # hook should sum them (or not reduced at all) are off by about 1e-1.
    diff = max((w - a).abs().max().item() for w, a in zip(weights, alone))
    print(f"ranks {size}, algorithm {hvd.algorithm()}, op {args.op}, last loss "
          f"{loss.item():.4f}, replicas identical: {all(s == sums[0] for s in sums)}")
    print(f"hook reduced {hook.buckets} buckets (at most {most} in one step) and "
          f"{hook.elements} gradient values in {args.steps} steps; the model has "
          f"{sum(w.numel() for w in weights)} parameters")
    print(f"same weights as one process on the global batch: {diff < 1e-5} "
          f"(largest difference {diff:.1e})", flush=True)


if __name__ == "__main__":
    main()
