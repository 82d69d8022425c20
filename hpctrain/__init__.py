"""hpctrain: data-parallel training on HPC clusters with MPI and Horovod.

Launch with ``mpirun -np N python -m hpctrain SUBCOMMAND`` (or ``srun``); ``--help`` lists
the subcommands.
"""

__version__ = "0.1.0"

import os as _os

# An Open MPI built with CUDA support prints a banner from every rank at MPI_Init on a
# machine without the NVIDIA driver ("dlopen failed ... libcuda.so.1"); `hpctrain info`
# reports that more precisely (a driver, GPUs, a CUDA-aware library: which is missing). A
# setting of the user's own wins. Open MPI builds without CUDA ignore the variable.
_os.environ.setdefault("OMPI_MCA_opal_warn_on_missing_libcuda", "0")

# Before MPI_Init reads it: whether a rank waiting in MPI yields its core to the computing
# threads (hpctrain.mpi.waiting.wait_policy says when and why). A setting of the user's wins.
from .mpi import waiting as _waiting  # noqa: E402

_waiting.apply_wait_policy()
