"""The MPI library's reduce-scatter (``MPI_Reduce_scatter``): the baseline to beat.

Open MPI 4.1 picks recursive halving or a ring by size, in C. float16 and bfloat16 travel
as 16-bit integers reduced by a Python callback (:func:`.mpi.mpi_op`), as for allreduce.
"""

from .algorithm import block_layout
from .dtypes import mpi_datatype
from .mpi import mpi_op
from .reducescatter_call import ReduceScatterAlgorithm
from .registry import register


@register
class MpiReduceScatter(ReduceScatterAlgorithm):
    """``comm.Reduce_scatter`` on the private communicator."""

    name = "mpi"

    def run(self, comm, send, recv, bounds, reduction):
        counts, _ = block_layout(bounds)
        datatype = mpi_datatype(reduction.dtype)
        op = mpi_op(reduction.dtype, reduction.op)[1]
        comm.Reduce_scatter([send, datatype], [recv, datatype], counts, op=op)

    def device_capable(self, dtype, cuda_aware):
        # A Python reduction callback cannot read device memory.
        return cuda_aware is True and not dtype.half
