"""HSDP on the ``hpctrain`` backend: FSDP2's ``fully_shard`` on a (2, 2) ``DeviceMesh`` of
("replicate", "shard") sub-groups at np 4, for every allreduce algorithm.

Run under mpirun at np 4: ``python -m hpctrain.launch -np 4 python -m pytest --with-mpi
tests/mpi/test_torch_distributed_hsdp.py``; at any other np the mesh cannot be formed and the
test skips. Each step, every rank checks its shards against a model trained in one process on
the concatenated batch, shard by shard, the way PyTorch's HSDP parity test does:
``distribute_tensor`` of the one-process weights and gradients, which is a broadcast over the
replicate sub-group and then a scatter over the shard sub-group, interleaved with HSDP's own
reduce-scatters (shard) and all-reduces (replicate). In float64 the only difference is the
order of summation, so the tolerance is a few ulps of the largest value.
"""

import pytest
import torch
import torch.distributed as dist
from torch import nn

import hpctrain.torch.distributed  # noqa: F401 - registers the backend

from conftest import all_ranks

pytestmark = pytest.mark.mpi(min_size=4)

MESH = (2, 2)                       # (replicate, shard)
STEPS, ROWS, LR = 3, 3, 0.1
#: Ulps of the largest weight or gradient a shard may be off (float64, summed in any order).
ULPS = 64


def model():
    """The same network on every rank: 5 and 3 rows do not divide by 2 shards (padding)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def batches(size):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, ROWS * size, 4, generator=generator, dtype=torch.float64)
    y = torch.randn(STEPS, ROWS * size, 3, generator=generator, dtype=torch.float64)
    return x, y


def shard_errors(sharded, alone, what):
    """Each sharded parameter (or gradient) against the one-process one, distributed on its
    mesh: collective over both sub-groups, in the same order on every rank."""
    from torch.distributed.tensor import distribute_tensor

    errors = []
    for (name, got), want in zip(sharded.named_parameters(), alone.parameters()):
        if what == "grad":
            got, want = got.grad, want.grad
        mine = distribute_tensor(want.detach(), got.device_mesh, got.placements).to_local()
        allowed = ULPS * torch.finfo(torch.float64).eps * max(want.abs().max().item(), 1.0)
        off = (got.to_local() - mine).abs().max().item() if mine.numel() else 0.0
        if off > allowed:
            errors.append(f"{name} {what}: {off:.3g} from one process (allowed {allowed:.3g})")
    return errors


def test_hsdp_on_a_2x2_mesh_equals_one_process(dist_algo, comm):
    from torch.distributed.device_mesh import init_device_mesh
    from hpctrain.torch.distributed.versions import fully_shard

    rank, size = dist.get_rank(), dist.get_world_size()
    if size != MESH[0] * MESH[1]:
        pytest.skip(f"a {MESH} mesh needs {MESH[0] * MESH[1]} ranks, not {size}")
    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("replicate", "shard"))
    net, alone = model(), model()
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    sharded_sgd = torch.optim.SGD(net.parameters(), lr=LR)
    alone_sgd = torch.optim.SGD(alone.parameters(), lr=LR)
    x, y = batches(size)
    mine = slice(rank * ROWS, (rank + 1) * ROWS)
    errors = shard_errors(net, alone, "weight")
    for step in range(STEPS):
        for optimizer in (sharded_sgd, alone_sgd):
            optimizer.zero_grad()
        nn.functional.mse_loss(net(x[step, mine]), y[step, mine]).backward()
        nn.functional.mse_loss(alone(x[step]), y[step]).backward()
        errors += shard_errors(net, alone, "grad")
        sharded_sgd.step()
        alone_sgd.step()
        errors += shard_errors(net, alone, "weight")
    all_ranks(comm, not errors, errors)
