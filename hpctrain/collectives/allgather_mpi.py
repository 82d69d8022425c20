"""The MPI library's allgather (``MPI_Allgatherv`` on bytes): the baseline to beat.

The library picks its algorithm by size and rank count (Open MPI 4.1: Bruck or recursive
doubling for small messages, ring or neighbour exchange for large ones), in C.
"""

from .algorithm import block_layout
from .allgather_call import AllgatherAlgorithm
from .registry import register


@register
class MpiAllgather(AllgatherAlgorithm):
    """``comm.Allgatherv`` on the private communicator, the blocks as bytes."""

    name = "mpi"

    def run(self, comm, send, recv, bounds):
        from mpi4py import MPI

        counts, displacements = block_layout(bounds)
        comm.Allgatherv([send, MPI.BYTE], [recv, counts, displacements, MPI.BYTE])
