"""Checks made before GPU work starts, so that a known dead end is a clear error naming the
fix, instead of a segmentation fault or a traceback from deep inside Horovod or NCCL.

Each check comes in two parts: a pure function of plain facts (``*_problem``: the message,
or ``None`` when all is well), tested without a GPU, and a ``check_*`` function that gathers
the facts from torch, Horovod and MPI and raises :class:`~hpctrain.errors.UsageError`
(local checks, which the caller runs inside :func:`hpctrain.runtime.checks`) or, after the
collective that tells every rank every rank's problem (:func:`hpctrain.runtime.agree`'s),
the same :class:`~hpctrain.errors.Verdict` on every rank.
Under ``python -m hpctrain`` either ends the whole job with status 2, so no rank is left
waiting for one that stopped here.
"""

import os

from .devices import ranks_on_node
from .errors import UsageError
from .runtime import common_verdict

#: The first NCCL release said to accept two ranks on one GPU; older ones refuse it at
#: ``ncclCommInitRank`` ("invalid usage"), as NCCL 2.28 does.
NCCL_SHARED_GPU = (2, 30)


# ----- a CUDA device requested where torch sees none ----------------------------------------

def cuda_missing_problem(option, torch_version, torch_cuda, visible_devices, count):
    """Why ``option`` (e.g. ``--device cuda``) cannot run, or ``None`` when ``count`` GPUs
    are visible. ``torch_cuda`` is ``torch.version.cuda`` (``None`` for a CPU build) and
    ``visible_devices`` the value of ``CUDA_VISIBLE_DEVICES`` (``None`` when unset)."""
    if count > 0:
        return None
    head = f"{option}: torch {torch_version} sees no CUDA GPU"
    if torch_cuda is None:
        return (f"{head}: it is a CPU-only build of torch. On a GPU machine, "
                f"`scripts/setup --gpu` installs the CUDA build (or HPCTRAIN_SYSTEM_PACKAGES=1 "
                f"uses the system's torch); elsewhere use --device cpu")
    if visible_devices is not None and visible_devices.strip() in ("", "-1", "none"):
        return (f"{head}: CUDA_VISIBLE_DEVICES={visible_devices!r} hides every GPU from this "
                f"process; unset it or name the GPUs (e.g. CUDA_VISIBLE_DEVICES=0,1), or ask "
                f"the scheduler for GPUs (--gpus-per-node)")
    return (f"{head}, although it is built for CUDA {torch_cuda}: no NVIDIA driver or GPU "
            f"on this node (check `nvidia-smi`), or CUDA_VISIBLE_DEVICES="
            f"{visible_devices!r} names none that exists; use --device cpu otherwise")


def check_cuda_visible(option="--device cuda"):
    """Raise a ``UsageError`` naming the cause unless torch sees a CUDA device."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    problem = cuda_missing_problem(option, torch.__version__.split("+")[0], torch.version.cuda,
                                   os.environ.get("CUDA_VISIBLE_DEVICES"), count)
    if problem:
        raise UsageError(problem)


# ----- Horovod asked to reduce CUDA tensors -------------------------------------------------

def horovod_cuda_problem(cuda_built, nccl_version, mpi_cuda_aware, option):
    """Why this Horovod cannot reduce CUDA tensors, or ``None``.

    ``cuda_built``: ``hvd.cuda_built()``; ``nccl_version``: ``hvd.nccl_built()`` (0 without
    NCCL, else NCCL's version code); ``mpi_cuda_aware``: the ``aware`` field of
    :func:`hpctrain.mpi_support.cuda_awareness` (``True``, ``False`` or ``None``)."""
    if not cuda_built:
        return (f"{option}: this Horovod is built without GPU operations (hvd.cuda_built() is "
                f"false), so it cannot reduce CUDA tensors. Rebuild it with "
                f"`scripts/build-horovod --gpu nccl` (or `--gpu mpi` over a CUDA-aware MPI), "
                f"or average gradients with one of hpctrain's own algorithms "
                f"(--allreduce ring, mpi, ...), which stage device memory when they must")
    if not nccl_version and mpi_cuda_aware is not True:
        return (f"{option}: this Horovod moves GPU tensors with MPI (built with "
                f"HOROVOD_GPU_OPERATIONS=MPI), but the MPI library is not known to be "
                f"CUDA-aware (see `hpctrain info`): it would be handed device memory it cannot "
                f"read. Build a CUDA-aware Open MPI (`scripts/build-cuda-mpi`), rebuild Horovod "
                f"with `--gpu nccl`, or use one of hpctrain's own algorithms")
    return None


def nccl_release(code):
    """``(major, minor)`` of an NCCL version code (``NCCL_VERSION_CODE``, as
    ``hvd.nccl_built()`` returns it): ``X*10000 + Y*100 + Z`` since 2.9, ``X*1000 + Y*100 + Z``
    before."""
    if code >= 10000:
        return code // 10000, code % 10000 // 100
    return code // 1000, code % 1000 // 100


def nccl_shared_gpu_problem(nccl_version, ranks_on_node, gpus_on_node, option,
                            user="this Horovod moves GPU tensors with", instead=None):
    """Why NCCL would refuse this placement (more ranks than GPUs on a node), or ``None``.

    NCCL before :data:`NCCL_SHARED_GPU` refuses to put two ranks of one communicator on the
    same GPU; Horovod reports it as ``ncclCommInitRank failed: invalid usage`` mid-run.
    ``user`` says who runs NCCL, ``instead`` what else would do (Horovod's ways by default)."""
    if not nccl_version or ranks_on_node <= gpus_on_node:
        return None
    if nccl_release(nccl_version) >= NCCL_SHARED_GPU:
        return None
    major, minor = nccl_release(nccl_version)
    if instead is None:
        instead = ("use one of hpctrain's own algorithms (--allreduce ring, mpi, ...); or use "
                   "a Horovod built with `scripts/build-horovod --gpu mpi` over a CUDA-aware "
                   "MPI, which lets ranks share a GPU")
    return (f"{option}: {ranks_on_node} ranks share {gpus_on_node} GPU"
            f"{'s' if gpus_on_node != 1 else ''} on this node, and {user} NCCL "
            f"{major}.{minor}, which refuses two ranks on one GPU (ncclCommInitRank: invalid "
            f"usage). Start one rank per GPU (e.g. srun --ntasks-per-node={gpus_on_node} "
            f"--gpus-per-task=1, or mpirun --map-by ppr:{gpus_on_node}:node); or {instead}")


def horovod_cuda_verdict(comm, option="--allreduce horovod with --device cuda"):
    """The :class:`~hpctrain.errors.Verdict` on why the installed Horovod cannot reduce CUDA
    tensors with the ranks of ``comm`` placed as they are, or ``None``; the same on every
    rank (a problem not every rank found names its ranks). Call it before ``hvd.init``,
    after each rank has chosen its GPU.

    Synchronisation point: collective over ``comm`` (a shared-memory split counts the ranks
    on each node, and one allgather shares the problems), so every rank must call it."""
    problem = _horovod_problem(comm, ranks_on_node(comm), option)
    return common_verdict(comm, problem)


def check_horovod_cuda(comm, option="--allreduce horovod with --device cuda"):
    """Raise the same ``Verdict`` on every rank if :func:`horovod_cuda_verdict` finds a
    problem. Synchronisation point, as that function."""
    verdict = horovod_cuda_verdict(comm, option)
    if verdict is not None:
        raise verdict


def _horovod_problem(comm, on_node, option):
    import torch

    from .mpi_support import cuda_awareness

    try:
        import horovod.torch as hvd
    except ImportError as exc:
        return f"{option}: Horovod is not importable ({exc}); scripts/setup builds it"
    cuda, nccl = bool(hvd.cuda_built()), int(hvd.nccl_built())
    aware = cuda_awareness(comm).aware if cuda and not nccl else None
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return horovod_cuda_problem(cuda, nccl, aware, option) or \
        nccl_shared_gpu_problem(nccl, on_node, gpus, option)
