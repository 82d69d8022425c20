"""``train(TrainConfig(device="cuda"))`` under mpirun: the weights of the same run on CPU,
and the GPU each rank picks (node-local rank modulo the GPU count, so ranks outnumbering
the GPUs share them: two ranks on a one-GPU machine both use ``cuda:0``).

Horovod's GPU run is in test_gpu_horovod.py.
"""

import pytest
import torch

from gpu_support import COMM, GPU_MODULE, all_ranks
from gpu_support import data_file, tiny_config  # noqa: F401 - fixtures
from hpctrain.data import HDF5Dataset
from hpctrain.devices import node_local_rank
from hpctrain.models import build_model
from hpctrain.train import train

pytestmark = GPU_MODULE


def initial_weights(config):
    """The model's weights before training (every rank builds the same from the seed)."""
    with HDF5Dataset(config.data) as data:
        model = build_model(config.model, data.sample_shape, data.num_classes,
                            hidden=config.hidden, seed=config.seed)
    return model.state_dict()


@pytest.mark.parametrize("algo", ["ring", "butterfly", "mpi"])
def test_training_on_cuda_reaches_the_cpu_weights(tiny_config, algo):
    on_cpu = train(tiny_config(f"cpu-{algo}", allreduce=algo), COMM)
    on_gpu = train(tiny_config(f"cuda-{algo}", device="cuda", allreduce=algo), COMM)
    initial = initial_weights(tiny_config("initial"))
    # float32 on another device sums in another order: a few ulps per step, far below the
    # tolerance; the weights moved much further than it during training (checked below).
    far = [k for k in on_cpu.state
           if not torch.allclose(on_gpu.state[k], on_cpu.state[k], rtol=1e-4, atol=1e-5)]
    moved = any(not torch.allclose(on_cpu.state[k], initial[k], rtol=1e-2, atol=1e-3)
                for k in on_cpu.state)
    failures = [f"weights differ from the CPU run: {far}"] if far else []
    failures += [] if moved else ["training did not move the weights: the test proves nothing"]
    failures += [] if on_gpu.step == on_cpu.step else [f"steps {on_gpu.step} != {on_cpu.step}"]
    all_ranks(not failures, failures)


def test_each_rank_trains_on_its_local_rank_gpu(tiny_config):
    result = train(tiny_config("mapping", device="cuda", allreduce="ring", epochs=1), COMM)
    local = node_local_rank(COMM)
    want = local % torch.cuda.device_count()
    got = torch.cuda.current_device()
    all_ranks(got == want and result.step > 0,
              [f"local rank {local} trained on cuda:{got}, want cuda:{want}"])
