"""The MPI library's alltoall (``MPI_Alltoallv`` on bytes): the baseline to beat.

Open MPI 4.1's ``Alltoallv`` posts every receive and send at once (or goes pairwise), in C.
"""

from .algorithm import block_layout
from .alltoall_call import AlltoallAlgorithm
from .registry import register


@register
class MpiAlltoall(AlltoallAlgorithm):
    """``comm.Alltoallv`` on the private communicator, the blocks as bytes."""

    name = "mpi"

    def run(self, comm, send, send_bounds, recv, recv_bounds):
        from mpi4py import MPI

        send_counts, send_displacements = block_layout(send_bounds)
        recv_counts, recv_displacements = block_layout(recv_bounds)
        comm.Alltoallv([send, send_counts, send_displacements, MPI.BYTE],
                       [recv, recv_counts, recv_displacements, MPI.BYTE])
