"""The MPI library's own allreduce (``MPI_Allreduce``, in place): the baseline to beat.

The library picks its algorithm by message size and rank count (Open MPI 4.1: recursive
doubling for small messages, ring or Rabenseifner for large ones), in C, with no Python in
between, so it is what our Python algorithms are measured against.

MPI has no 16-bit float type: float16 and bfloat16 travel as ``MPI_SHORT`` and are reduced
by a user-defined operation that calls back into Python (torch), once per segment — correct,
but slower than the library's built-in operations.
"""

from .algorithm import Algorithm
from .kernels import host_reducer
from .registry import ALGORITHMS, register

_OPS = {}   # (dtype name, op) -> (MPI.IN_PLACE, MPI.Op): looked up once per call


def mpi_op(dtype, op):
    """``(MPI.IN_PLACE, the MPI.Op reducing dtype with op)``; ``avg`` reduces with a sum."""
    found = _OPS.get((dtype.name, op))
    if found is None:
        from mpi4py import MPI

        reduce_op = "sum" if op == "avg" else op
        if dtype.half:
            found = MPI.IN_PLACE, MPI.Op.Create(_half_callback(dtype, reduce_op), commute=True)
        else:
            found = MPI.IN_PLACE, {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX,
                                   "prod": MPI.PROD}[reduce_op]
        _OPS[(dtype.name, op)] = found
    return found


def _half_callback(dtype, op):
    import numpy as np

    reduce = host_reducer(dtype, op, count=0)

    def apply(inbuf, inoutbuf, _datatype):
        src = np.frombuffer(inbuf, dtype=np.int16)
        if not src.flags.writeable:
            src = src.copy()   # torch.from_numpy warns on read-only arrays
        reduce(np.frombuffer(inoutbuf, dtype=np.int16), src)
    return apply


@register
class MpiAllreduce(Algorithm):
    """``comm.Allreduce(MPI.IN_PLACE, buf, op)`` on the private communicator."""

    name = "mpi"

    def run(self, comm, flat, plan):
        in_place, op = _OPS.get((plan.dtype.name, plan.op)) or mpi_op(plan.dtype, plan.op)
        comm.Allreduce(in_place, flat, op=op)

    fitted = False   # the better of two formulas is not one linear row

    def predict(self, nbytes, ranks, nodes, params, machine):
        """The better of ring and butterfly (default switch): what a tuned library picks."""
        return min(ALGORITHMS[name].predict(nbytes, ranks, nodes,
                                            ALGORITHMS[name].parameters(ranks, {}), machine)
                   for name in ("ring", "butterfly"))

    def device_capable(self, dtype, cuda_aware):
        # A Python reduction callback cannot read device memory.
        return cuda_aware is True and not dtype.half
