"""The MPI library's reduce (``MPI_Reduce``): the baseline to beat.

Open MPI picks among its tree and pipelined algorithms by message size and rank count, in
C. float16 and bfloat16 travel as 16-bit integers reduced by a Python callback
(:func:`.mpi.mpi_op`), as for allreduce.
"""

from .dtypes import mpi_datatype
from .mpi import mpi_op
from .reduce_call import ReduceAlgorithm
from .registry import register


@register
class MpiReduce(ReduceAlgorithm):
    """``comm.Reduce`` on the private communicator."""

    name = "mpi"

    def run(self, comm, send, recv, root, reduction):
        datatype = mpi_datatype(reduction.dtype)
        op = mpi_op(reduction.dtype, reduction.op)[1]
        # The receive buffer is significant on the root only, as MPI_Reduce defines it.
        comm.Reduce([send, datatype], None if recv is None else [recv, datatype], op=op,
                    root=root)

    def device_capable(self, dtype, cuda_aware):
        # A Python reduction callback cannot read device memory.
        return cuda_aware is True and not dtype.half
