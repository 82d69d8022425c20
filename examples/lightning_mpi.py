"""PyTorch Lightning's Trainer over MPI: ``DDPStrategy(process_group_backend="hpctrain")``.

    mpirun -np 2 python examples/lightning_mpi.py
    HPCTRAIN_ALLREDUCE=butterfly mpirun -np 4 python examples/lightning_mpi.py
    srun -n 4 python examples/lightning_mpi.py

A plain Lightning script (``pip install lightning``; not a dependency of hpctrain). Two things
make it run under an MPI launcher:

- ``import hpctrain.torch.distributed`` registers the ``hpctrain`` backend, which
  ``DDPStrategy(process_group_backend="hpctrain")`` names;
- Lightning learns rank and size from its ``MPIEnvironment`` (mpi4py's ``COMM_WORLD``), which
  it picks by itself when the job has more than one rank (given explicitly here, so that a
  one-rank run behaves alike); ``devices`` (ranks per node) and ``num_nodes`` must still
  describe the launch, since Lightning's samplers count replicas as ``devices x num_nodes``:
  :func:`mpi_layout` reads them from MPI.

It trains a small MLP on scikit-learn's bundled handwritten digits with a fixed *global*
batch (``--global-batch``, split evenly over the ranks), so that any number of ranks takes
the same steps as one process: rank 0 prints the test accuracy and, with ``--save``, writes
the final weights (tests/test_examples.py compares them with one process's).
"""

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.environments import LightningEnvironment, MPIEnvironment
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hpctrain.torch.distributed  # noqa: F401 - registers the "hpctrain" backend
from hpctrain.data.digits import load_arrays


def mpi_layout():
    """``(devices, num_nodes)`` of this MPI job for Lightning's ``Trainer``: ranks per node
    and nodes. ``ValueError`` where nodes have different numbers of ranks (Lightning counts
    replicas as ``devices x num_nodes``)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    devices = node.Get_size()
    node.Free()
    per_node = set(world.allgather(devices))
    if len(per_node) > 1:
        raise ValueError(f"Lightning needs the same number of ranks on every node; this job "
                         f"has {sorted(per_node)}: launch with --map-by ppr:N:node (Open MPI) "
                         f"or --ntasks-per-node=N (Slurm)")
    return devices, world.Get_size() // devices


def datasets(global_batch):
    """Train and test splits of the 8x8 digits, flattened, in a fixed shuffled order; the
    train split cut to whole global batches (so no rank pads its share)."""
    x, y = (torch.from_numpy(a) for a in load_arrays())
    x = x.reshape(len(x), -1)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    cut = int(0.8 * len(x))
    rows = cut // global_batch * global_batch
    return TensorDataset(x[:rows], y[:rows]), TensorDataset(x[cut:], y[cut:])


class Classifier(L.LightningModule):
    """A two-layer MLP over the 64 pixels, trained with SGD."""

    def __init__(self, lr):
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def accuracy(model, test_set):
    """The test accuracy of ``model`` over the whole of ``test_set`` (on this rank alone)."""
    x, y = test_set.tensors
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=96,
                        help="samples per step over all ranks (divisible by their number)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--save", help="rank 0 writes the final state_dict here")
    args = parser.parse_args()

    devices, num_nodes = mpi_layout()
    size = devices * num_nodes
    if args.global_batch % size:
        raise SystemExit(f"--global-batch {args.global_batch} does not divide by the "
                         f"{size} ranks")
    L.seed_everything(42, verbose=False)       # also the seed of Lightning's samplers
    torch.set_num_threads(1)
    train_set, test_set = datasets(args.global_batch)
    loader = DataLoader(train_set, batch_size=args.global_batch // size, shuffle=True)
    model = Classifier(args.lr)
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, num_nodes=num_nodes, max_epochs=args.epochs,
        strategy=DDPStrategy(process_group_backend="hpctrain"),
        plugins=[MPIEnvironment() if size > 1 else LightningEnvironment()],
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        import torch.distributed as dist

        print(f"test accuracy {100 * accuracy(model, test_set):.2f}%", flush=True)
        print(f"ranks {trainer.world_size}, backend {dist.get_backend()}, environment "
              f"{type(trainer.strategy.cluster_environment).__name__}, algorithm "
              f"{hpctrain.torch.algorithm()}", flush=True)
        if args.save:
            torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
