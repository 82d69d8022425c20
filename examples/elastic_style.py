"""An elastic training script written for Horovod; only its import line names hpctrain.

    # in place, on an MPI with fault tolerance (scripts/setup --ft):
    python -m hpctrain.launch --elastic -np 4 --min-np 2 python examples/elastic_style.py
    # by restart, on any MPI:
    python -m hpctrain.launch --elastic --no-ft -np 4 --min-np 2 python examples/elastic_style.py

It trains a small MLP on scikit-learn's handwritten digits (bundled, no download) the way
Horovod's elastic examples do: the model, optimizer and an ``ElasticSampler`` in a
``TorchState``, a commit every ``--commit-every`` steps and at each epoch's end, the
learning rate scaled to the number of ranks again after every reset. Lose a rank and the
others go on from the last commit. ``--log FILE``: rank 0 appends one JSON line per step
(step, epoch, ranks, wall-clock time), from which the cost of a failure is measured.
``HPCTRAIN_FAULT=torch.step@2#20/0:kill`` kills rank 2 at its 20th optimizer step in the
job's first start (``/1``: the first restart; see ``hpctrain.faults``).
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import hpctrain.torch as hvd     # was: import horovod.torch as hvd
from horovod_style import datasets      # the digits' train and test splits, as there


def accuracy(model, test_set):
    """Test accuracy over every rank's share of the test set (each sample counted once)."""
    share = range(hvd.rank(), len(test_set), hvd.size())
    x, y = test_set[list(share)]
    with torch.no_grad():
        correct = (model(x).argmax(1) == y).sum()
    total = hvd.allreduce(torch.tensor([float(correct), float(len(share))]), op=hvd.Sum,
                          name="accuracy")
    return (total[0] / total[1]).item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--commit-every", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.0,
                        help="sleep this long in each step (a longer job to lose ranks in)")
    parser.add_argument("--log", help="rank 0 appends one JSON line per step here")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(42)
    torch.set_num_threads(1)
    train_set, test_set = datasets()
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0)

    def scale_lr():
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    state.register_reset_callbacks([scale_lr])

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                time.sleep(args.step_seconds)
                state.step += 1
                sampler.record_batch(0, args.batch_size)
                if hvd.rank() == 0 and args.log:
                    with open(args.log, "a") as log:
                        log.write(json.dumps({"step": state.step, "epoch": state.epoch,
                                              "ranks": hvd.size(),
                                              "time": time.time()}) + "\n")
                if state.step % args.commit_every == 0:
                    state.commit()
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    result = accuracy(model, test_set)
    if hvd.rank() == 0:
        print(f"done: {state.step} steps on {hvd.size()} ranks, test accuracy "
              f"{100 * result:.2f}%", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
