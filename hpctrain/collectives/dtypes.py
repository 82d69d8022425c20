"""The element types and reduction operations every allreduce and reduce-scatter algorithm
accepts, and the raw bytes that allgather and alltoall move (:data:`BYTES`)."""

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError


@dataclass(frozen=True)
class DType:
    """An element type allreduce accepts, and how it travels and is reduced."""

    name: str
    code: int                 # the number the mismatch check compares
    itemsize: int
    transport: str            # NumPy dtype the bytes travel as (MPI has no 16-bit float)
    integer: bool = False
    half: bool = False        # float16 and bfloat16: reduced with torch, in own precision

    @property
    def numpy(self):
        """The NumPy dtype of this type's values (``None`` for bfloat16: NumPy has none)."""
        return None if self.name == "bfloat16" else np.dtype(self.name)

    @property
    def torch(self):
        """The torch dtype of this type's values."""
        import torch

        return getattr(torch, self.name)


#: Supported element types by name.
DTYPES = {d.name: d for d in (
    DType("float16", 1, 2, "int16", half=True),
    DType("bfloat16", 2, 2, "int16", half=True),
    DType("float32", 3, 4, "float32"),
    DType("float64", 4, 8, "float64"),
    DType("int32", 5, 4, "int32", integer=True),
    DType("int64", 6, 8, "int64", integer=True),
)}

#: Reduction operations by name, with the number the mismatch check compares. ``avg`` is
#: ``sum`` followed by a division by the number of ranks (floor division for integers);
#: ``prod`` multiplies (integers wrap on overflow, as NumPy's and MPI's do).
OPS = {"sum": 1, "avg": 2, "min": 3, "max": 4, "prod": 5}

#: Raw bytes: what allgather and alltoall move, whatever the elements are (they reduce
#: nothing, so any dtype travels as a byte view). Not a reduction type: not in ``DTYPES``.
BYTES = DType("bytes", 0, 1, "uint8", integer=True)

#: The supported NumPy dtypes, to their :class:`DType`.
NUMPY_DTYPES = {np.dtype(d.name): d for d in DTYPES.values() if d.numpy is not None}


def choices(names):
    """``names`` as a sorted, comma-separated list, for error messages."""
    return ", ".join(sorted(names))


def bad_dtype(name, what="allreduce"):
    """The ``UsageError`` for an element type ``what`` (a collective) does not support."""
    return UsageError(f"{what} does not support dtype {name}; valid choices: "
                      f"{choices(DTYPES)}")


def mpi_datatype(dtype):
    """The MPI datatype of ``dtype``'s transport elements (MPI is loaded by then)."""
    from mpi4py import MPI

    return {"int16": MPI.INT16_T, "int32": MPI.INT32_T, "int64": MPI.INT64_T,
            "float32": MPI.FLOAT, "float64": MPI.DOUBLE, "uint8": MPI.BYTE}[dtype.transport]
