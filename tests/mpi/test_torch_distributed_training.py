"""PyTorch's own training stacks on the ``hpctrain`` backend: ``DistributedDataParallel``
(its own buckets, no hook) and FSDP2's ``fully_shard``, for every allreduce algorithm.

Run under mpirun at np = 1..4: ``mpirun -np N python -m pytest --with-mpi
tests/mpi/test_torch_distributed_training.py``. N ranks with b rows each must reach the
weights of one process trained here on the N·b rows side by side (mean loss, plain SGD): in
float32, and in bfloat16 and float16 (parameters, gradients and the reductions in that
dtype) within a tolerance derived from the dtype's precision (see :func:`tolerance`).
"""


import pytest
import torch
import torch.distributed as dist
from torch import nn

import hpctrain.torch.distributed  # noqa: F401 - registers the backend

from conftest import all_ranks

pytestmark = pytest.mark.mpi

STEPS, ROWS, LR = 3, 4, 0.1
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def model(dtype):
    """The same small network on every rank (three layers, so FSDP2 has several units)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 3)).to(dtype)


def batches(size, dtype):
    """``STEPS`` global batches of ``ROWS`` rows per rank, the same on every rank."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, ROWS * size, 6, generator=generator)
    y = torch.randn(STEPS, ROWS * size, 3, generator=generator)
    return x.to(dtype), y.to(dtype)


def train(net, x, y, rows):
    """``STEPS`` of SGD on ``rows`` of each batch; the largest gradient seen (of a plain
    module: a sharded one's gradients are DTensors, some of them empty on a rank)."""
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    largest = 0.0
    for step in range(STEPS):
        optimizer.zero_grad()
        nn.functional.mse_loss(net(x[step, rows]), y[step, rows]).backward()
        if rows == slice(None):
            largest = max(largest, *(float(p.grad.float().abs().max())
                                     for p in net.parameters()))
        optimizer.step()
    return largest


def tolerance(dtype, size, weight, largest_grad):
    """How far a weight may be from the one-process run after ``STEPS`` steps: per step,
    one rounding of the weight (``eps * |w|``) plus the gradient's rounding error through
    the reduction, at most one rounding per rank and one for the average (``(size + 1) *
    eps * |g|``), times the learning rate."""
    eps = torch.finfo(dtype).eps
    return STEPS * eps * (weight.abs().max().item() + LR * (size + 1) * largest_grad)


def check_against_one_process(net, dtype, comm, gather):
    rank, size = dist.get_rank(), dist.get_world_size()
    x, y = batches(size, dtype)
    train(net, x, y, slice(rank * ROWS, (rank + 1) * ROWS))
    alone = model(dtype)
    largest = train(alone, x, y, slice(None))
    failures = []
    for (name, got), want in zip(net.named_parameters(), alone.parameters()):
        got = gather(got).detach().float()
        allowed = tolerance(dtype, size, want.float(), largest)
        off = (got - want.detach().float()).abs().max().item()
        if off > allowed:
            failures.append(f"{name}: {off:.3g} from one process (allowed {allowed:.3g})")
    all_ranks(comm, not failures, failures)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ddp_equals_one_process(dist_algo, comm, dtype):
    from torch.nn.parallel import DistributedDataParallel

    # Tiny buckets: several per step, reduced while backward runs.
    net = DistributedDataParallel(model(dtype), bucket_cap_mb=100 / 2**20)
    assert dist.get_backend(net.process_group) == "hpctrain"
    check_against_one_process(net, dtype, comm, lambda p: p)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fsdp2_equals_one_process(dist_algo, comm, dtype):
    from hpctrain.torch.distributed.versions import fully_shard

    net = model(dtype)
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    check_against_one_process(net, dtype, comm, lambda p: p.full_tensor())


def test_hsdp_on_a_2d_mesh_equals_one_process(dist_algo, comm):
    from torch.distributed.device_mesh import init_device_mesh
    from hpctrain.torch.distributed.versions import fully_shard

    size = dist.get_world_size()
    if size % 2:
        pytest.skip("a (replicate, shard) mesh of 2 columns needs an even number of ranks")
    # Replicas of 2 shards: gradients reduce-scattered within a replica, then all-reduced
    # across replicas (PREMUL_SUM or AVG on a mesh dimension's group).
    mesh = init_device_mesh("cpu", (size // 2, 2), mesh_dim_names=("replicate", "shard"))
    net = model(torch.float32)
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    check_against_one_process(net, torch.float32, comm, lambda p: p.full_tensor())
