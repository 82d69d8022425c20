"""The MPI library's broadcast (``MPI_Bcast`` on bytes): the baseline to beat.

Open MPI 4.1 picks a binomial tree for small messages and a pipelined or split-binary tree
(or scatter + allgather) for large ones, by size and rank count, in C.
"""

from .broadcast_call import BroadcastAlgorithm
from .registry import register


@register
class MpiBroadcast(BroadcastAlgorithm):
    """``comm.Bcast`` on the private communicator, the vector as bytes."""

    name = "mpi"

    def run(self, comm, buf, root):
        from mpi4py import MPI

        comm.Bcast([buf, MPI.BYTE], root=root)
