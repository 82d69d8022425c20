"""The ``hpctrain`` backend of torch.distributed on CUDA tensors. Run under mpirun:
``python -m hpctrain.launch -np 2 python -m pytest --with-mpi tests/gpu`` (scripts/gpu-verify
runs it at np 1 and 2 on a lent GPU).

Each collective on CUDA tensors must give, bit for bit, what it gives on CPU tensors (small
integers, exact in every dtype); a DDP step on the GPU must reach the weights of the same
step on the CPU. The collectives take device memory to a CUDA-aware MPI or stage it through
host memory (hpctrain.collectives decides); point-to-point always stages.
"""

import os

import pytest
import torch
import torch.distributed as dist

import hpctrain.torch.distributed  # noqa: F401 - registers the backend

from gpu_support import GPU_MODULE, RANK, SIZE, all_ranks, rank_device

pytestmark = GPU_MODULE


@pytest.fixture(scope="module", params=["ring", "butterfly", "mpi"])
def group(request):
    """The default group over ``HPCTRAIN_ALLREDUCE=<algorithm>``."""
    os.environ["HPCTRAIN_ALLREDUCE"] = request.param
    dist.init_process_group("hpctrain")
    torch.cuda.set_device(rank_device())
    yield request.param
    dist.destroy_process_group()
    del os.environ["HPCTRAIN_ALLREDUCE"]


def values(rank, count, dtype):
    return ((torch.arange(count) * 3 + 5 * rank) % 9 - 4).to(dtype)


def both(call, make):
    """``call`` on a CPU tensor and on its CUDA copy; the two results, on the CPU. The result
    is what ``call`` returns, or its argument (changed in place) where it returns nothing."""
    cpu = make()
    gpu = cpu.to(rank_device())
    cpu_result = call(cpu)
    gpu_result = call(gpu)
    torch.cuda.synchronize()
    return (cpu if cpu_result is None else cpu_result,
            (gpu if gpu_result is None else gpu_result).cpu())


def test_collectives_on_cuda_equal_cpu(group):
    failures = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        for name, op in (("SUM", dist.ReduceOp.SUM), ("MAX", dist.ReduceOp.MAX)):
            cpu, gpu = both(lambda t: dist.all_reduce(t, op=op),
                            lambda: values(RANK, 1001, dtype))
            if not torch.equal(cpu, gpu):
                failures.append(f"all_reduce {name} {dtype}")
        cpu, gpu = both(lambda t: dist.broadcast(t, src=SIZE - 1),
                        lambda: values(RANK, 333, dtype))
        if not torch.equal(cpu, gpu):
            failures.append(f"broadcast {dtype}")

        def gather(t):
            out = torch.empty(t.numel() * SIZE, dtype=t.dtype, device=t.device)
            dist.all_gather_into_tensor(out, t)
            return out
        cpu, gpu = both(gather, lambda: values(RANK, 77, dtype))
        if not torch.equal(cpu, gpu):
            failures.append(f"all_gather_into_tensor {dtype}")

        def scatter(t):
            out = torch.empty(t.numel() // SIZE, dtype=t.dtype, device=t.device)
            dist.reduce_scatter_tensor(out, t)
            return out
        cpu, gpu = both(scatter, lambda: values(RANK, 77 * SIZE, dtype))
        if not torch.equal(cpu, gpu):
            failures.append(f"reduce_scatter_tensor {dtype}")
    all_ranks(not failures, failures)


def test_send_recv_on_cuda(group):
    ok = True
    if SIZE > 1:
        got = torch.empty(5, device=rank_device())
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, values(RANK, 5, torch.float32).to(rank_device()),
                       (RANK + 1) % SIZE),
            dist.P2POp(dist.irecv, got, (RANK - 1) % SIZE)])
        for work in works:
            work.wait()
        ok = torch.equal(got.cpu(), values((RANK - 1) % SIZE, 5, torch.float32))
    all_ranks(ok)


def test_ddp_step_on_cuda_equals_cpu(group):
    from torch.nn.parallel import DistributedDataParallel

    weights = []
    for where in ("cpu", rank_device()):
        torch.manual_seed(0)
        net = DistributedDataParallel(torch.nn.Linear(8, 3).to(where))
        optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
        x = values(RANK, 16, torch.float32).view(2, 8).to(where)
        net(x).square().sum().backward()
        optimizer.step()
        weights.append([p.detach().cpu() for p in net.parameters()])
    same = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(*weights))
    all_ranks(same)


def test_fsdp2_on_cuda_equals_one_process(group):
    # Each rank trains its rows of every batch with its shards on its GPU; the whole model,
    # gathered, must equal one GPU trained on all the rows (mean loss, plain SGD, float32).
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = rank_device()
    steps, rows, lr = 3, 4, 0.1
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(steps, rows * SIZE, 6, generator=generator).to(device)
    y = torch.randn(steps, rows * SIZE, 3, generator=generator).to(device)

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                                   torch.nn.Linear(8, 3)).to(device)

    def train(net, mine):
        optimizer = torch.optim.SGD(net.parameters(), lr=lr)
        for step in range(steps):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(x[step, mine]), y[step, mine]).backward()
            optimizer.step()

    sharded = model()
    mesh = init_device_mesh("cuda", (SIZE,))
    for layer in sharded:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    train(sharded, slice(RANK * rows, (RANK + 1) * rows))
    alone = model()
    train(alone, slice(None))
    off = [(name, (got.full_tensor() - want).abs().max().item())
           for (name, got), want in zip(sharded.named_parameters(), alone.parameters())]
    all_ranks(all(gap <= 1e-5 for _, gap in off), off)
