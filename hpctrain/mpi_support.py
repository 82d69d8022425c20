"""The names of the MPI facts that ``hpctrain.launch`` and ``hpctrain.torch`` import from
here, kept until they import them from :mod:`hpctrain.mpi` (one concept a module: the
library, CUDA-awareness, the wait policy, ULFM, starting MPI), where everything else does."""

from .mpi.init import start
from .mpi.ulfm import fault_tolerance
from .mpi.waiting import WAIT_POLICY, YIELD_WHEN_IDLE

__all__ = ["WAIT_POLICY", "YIELD_WHEN_IDLE", "fault_tolerance", "start"]
