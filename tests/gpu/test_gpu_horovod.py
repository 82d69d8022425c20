"""Horovod on GPU: ``hvd.allreduce`` of CUDA tensors, through ``algo="horovod"`` and
directly, and training with ``--allreduce horovod --device cuda``. Run under mpirun.

Skipped, with the reason, where Horovod cannot reduce device memory: not installed, built
without CUDA (the CPU build of scripts/setup), or built without NCCL over an MPI that is not
CUDA-aware. Horovod runs last in this directory, and is shut down after this module: once
started, its background thread polls MPI every millisecond.
"""

import numpy as np
import pytest
import torch

from gpu_support import COMM, GPU_MODULE, RANK, SIZE, all_ranks, horovod_gpu_missing
from gpu_support import data_file, device, tiny_config  # noqa: F401 - fixtures
from hpctrain.collectives import DTYPES, OPS, allreduce
from hpctrain.train import train

MISSING = horovod_gpu_missing() if torch.cuda.is_available() else ""
pytestmark = [*GPU_MODULE, pytest.mark.skipif(bool(MISSING), reason=MISSING)]


@pytest.fixture(scope="module")
def hvd():
    """``horovod.torch``; Horovod is shut down after the module's last test (collective)."""
    import horovod.torch as hvd

    yield hvd
    from hpctrain.collectives import horovod as module

    module.shutdown()
    if hvd.is_initialized():        # started by the training run's DistributedOptimizer
        hvd.shutdown()


def contribution(rank, count, salt):
    """Integers in [-8, 8]: any sum over 4 ranks is exact in every dtype."""
    return (np.arange(count, dtype=np.int64) * 7 + rank * 13 + salt) % 17 - 8


def differs(got, want, dtype, op):
    """Elements where ``got`` is not ``want``; one ulp is allowed for a float average, which
    Horovod computes by scaling with 1/p (rounded) rather than by dividing."""
    got, want = got.to(torch.float64), want.to(torch.float64)
    if op == "avg" and not DTYPES[dtype].integer:
        return int(((got - want).abs() > torch.finfo(getattr(torch, dtype)).eps
                    * want.abs()).sum())
    return int((got != want).sum())


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_algo_horovod_on_cuda_tensors_matches_the_cpu_ring(hvd, device, dtype):
    failures = []
    for op in sorted(OPS):
        for count in (0, 1, SIZE + 1, 1009, (1 << 18) + 3):
            cpu = torch.tensor(contribution(RANK, count, salt=count), dtype=getattr(torch, dtype))
            gpu = cpu.to(device)
            allreduce(cpu, op=op, algo="ring")
            out = allreduce(gpu, op=op, algo="horovod")
            wrong = differs(gpu.cpu(), cpu, dtype, op)
            if out is not gpu or gpu.device != device or wrong:
                failures.append(f"{dtype} {op} n={count}: {wrong} wrong")
    all_ranks(not failures, failures)


def test_hvd_allreduce_of_a_cuda_tensor(hvd, device):
    from hpctrain.collectives.horovod import start

    start(COMM)                     # initialised over COMM_WORLD, if no test did it yet
    tensor = torch.full((1 << 20,), float(RANK + 1), device=device)
    summed = hvd.allreduce(tensor, op=hvd.Sum, name="gpu-check")
    ok = summed.device == device and bool((summed == SIZE * (SIZE + 1) / 2).all())
    all_ranks(ok, [f"on {summed.device}: {summed[:4].tolist()}"])


def test_training_with_horovod_on_cuda_reaches_the_cpu_ring_weights(hvd, device,
                                                                     tiny_config):
    on_cpu = train(tiny_config("cpu-ring", allreduce="ring"), COMM)
    on_gpu = train(tiny_config("cuda-horovod", device="cuda", allreduce="horovod"), COMM)
    far = [k for k in on_cpu.state
           if not torch.allclose(on_gpu.state[k], on_cpu.state[k], rtol=1e-4, atol=1e-5)]
    ok = not far and on_gpu.step == on_cpu.step and on_gpu.checksum is not None
    all_ranks(ok, [f"weights differ from the CPU run: {far}"] if far else [])
