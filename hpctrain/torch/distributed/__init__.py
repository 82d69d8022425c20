"""``torch.distributed`` over MPI: the process-group backend ``hpctrain``.

    import torch.distributed as dist
    import hpctrain.torch.distributed           # registers the backend; starts nothing

    dist.init_process_group("hpctrain")         # under mpirun -np N, srun, or alone
    model = torch.nn.parallel.DistributedDataParallel(model)

Importing registers the backend (``dist.Backend.register_backend``, for CPU and CUDA
tensors) and puts hpctrain's MPI rendezvous in front of torch's ``env://``
(:mod:`.rendezvous`): without ``MASTER_ADDR``/``MASTER_PORT``, rank and size come from MPI
and no store is made. Nothing else happens until ``init_process_group``: MPI starts there.

The default group is hpctrain.torch's world (started by ``init_process_group`` unless
``hvd.init`` started it), its collectives queued on the same communication thread and run
with the algorithms of :mod:`hpctrain.collectives` (``HPCTRAIN_ALLREDUCE``); every
``new_group`` is a process set of that world (:mod:`.group`). docs/torch-distributed.md
says what is supported, how, and what is not.
"""

import torch.distributed as dist

from . import versions

versions.check_torch()      # before the modules below reach what older torch lacks

from . import rendezvous  # noqa: E402
from .group import BACKEND, ProcessGroupHpctrain, create  # noqa: E402

__all__ = ["BACKEND", "ProcessGroupHpctrain", "register"]


def register():
    """Register the ``hpctrain`` backend and its rendezvous with torch (once; importing
    this module does it)."""
    rendezvous.install()
    versions.delegate_new_group(lambda group: isinstance(group, ProcessGroupHpctrain))
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, create, extended_api=True,
                                      devices=["cpu", "cuda"])


register()
