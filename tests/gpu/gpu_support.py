"""What every GPU test shares: the communicator, the skip for machines without CUDA, the
rank's GPU, the collective assertion and the fixtures (a module imports the fixtures it
uses). Not a conftest.py: a second module named ``conftest`` would shadow tests/conftest.py
for the tests that import from it."""

from functools import partial

import pytest
import torch
from mpi4py import MPI

import conftest
from hpctrain.devices import node_local_rank
from hpctrain.train import TrainConfig

COMM = MPI.COMM_WORLD
SIZE, RANK = COMM.Get_size(), COMM.Get_rank()

#: Every GPU test needs a CUDA device; torch's CPU build (CI, laptops) sees none.
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device: torch sees none "
                                       "(CPU build or no GPU visible to this process)")

#: The marks of every module here: run under mpirun (pytest-mpi), GPU only.
GPU_MODULE = [pytest.mark.mpi, pytest.mark.gpu, needs_cuda]


def rank_device():
    """The GPU the library's convention gives this rank: node-local rank modulo the GPU
    count, so that ranks outnumbering GPUs share them (collective over ``COMM``)."""
    return torch.device("cuda", node_local_rank(COMM) % torch.cuda.device_count())


#: ``all_ranks(ok, failures=())``: tests/conftest.py's collective assertion, over ``COMM``.
all_ranks = partial(conftest.all_ranks, COMM)


def horovod_gpu_missing():
    """Why Horovod cannot reduce CUDA tensors here, or ``""`` if it can."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        return f"Horovod is not installed ({exc}); scripts/setup builds it"
    if not hvd.cuda_built():
        return ("Horovod built without GPU operations (hvd.cuda_built() is False): rebuild "
                "it with HOROVOD_GPU_OPERATIONS=NCCL, see docs/gpu.md")
    if not hvd.nccl_built():
        from hpctrain.mpi.cuda import cuda_awareness

        awareness = cuda_awareness()
        if awareness.aware is not True:
            return (f"Horovod has no NCCL and MPI is not CUDA-aware ({awareness}): its GPU "
                    f"allreduce cannot run")
    return ""


# ----- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def device():
    """This rank's GPU (collective): see :func:`rank_device`."""
    return rank_device()


#: tests/conftest.py's ``data_file`` (its ``SMALL_DATA``: 40 rows of 1x3x3 over 3 classes,
#: written by rank 0), for the modules here to import with the fixtures that use it.
data_file = conftest.data_file


@pytest.fixture
def tiny_config(data_file, tmp_path):
    """``tiny_config(name, **changes)``: a few SGD steps on ``data_file``, in a run directory
    of its own (under rank 0's temporary directory, shared by every rank)."""
    run_root = COMM.bcast(str(tmp_path), root=0)

    def make(name, **changes):
        settings = dict(data=str(data_file), run_dir=f"{run_root}/{name}", hidden=8, epochs=2,
                        batch_size=3, val_fraction=0.25, lr=0.1, momentum=0.9,
                        lr_scaling="none", warmup_epochs=0.0, lr_decay="none",
                        checkpoint_every="0", progress="never")
        return TrainConfig(**{**settings, **changes})
    return make
