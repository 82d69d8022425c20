"""What the MPI library under mpi4py is, and whether it accepts GPU buffers (CUDA-aware).

mpi4py itself has no CUDA-awareness query. We ask, in order of trust:

1. the MPI 4.1 ``mpi_memory_alloc_kinds`` info key of ``COMM_WORLD`` (MPICH 4.2+, Open MPI 5+);
2. Open MPI's extension ``MPIX_Query_cuda_support()``, looked up in the loaded library, which
   answers for the running library (a CUDA-built Open MPI may still have CUDA disabled);
3. Open MPI's ``ompi_info --parsable --all`` (``mpi_built_with_cuda_support:value``), which
   answers for how the library was built.

The first method that gives an answer decides; the answer carries the method's name.
"""

import ctypes
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class CudaAwareness:
    """Whether MPI accepts CUDA device buffers (``None``: could not tell) and how we know."""

    aware: object
    method: str

    def __str__(self):
        word = {True: "yes", False: "no", None: "unknown"}[self.aware]
        return f"{word} ({self.method})"


def library_version():
    """The MPI library's own one-line version string, e.g. ``Open MPI v4.1.4, ...``."""
    from mpi4py import MPI

    return MPI.Get_library_version().strip("\x00 \n").splitlines()[0].strip()


def standard_version():
    """The MPI standard version the library implements, e.g. ``3.1``."""
    from mpi4py import MPI

    return "%d.%d" % MPI.Get_version()


def cuda_awareness(comm=None):
    """Detect whether the MPI library under mpi4py is CUDA-aware; see the module docstring."""
    for probe in (_from_alloc_kinds, _from_mpix_query, _from_ompi_info):
        answer = probe(comm)
        if answer is not None:
            return answer
    return CudaAwareness(None, "no method available: not Open MPI and no MPI 4.1 info key")


def _from_alloc_kinds(comm):
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    try:
        info = comm.Get_info()
    except MPI.Exception:
        return None
    try:
        kinds = info.Get("mpi_memory_alloc_kinds")
    finally:
        info.Free()
    if kinds is None:
        return None
    return CudaAwareness("cuda" in kinds.lower(), f"mpi_memory_alloc_kinds={kinds}")


def _from_mpix_query(_comm):
    if "Open MPI" not in library_version():
        return None
    try:
        query = ctypes.CDLL(None).MPIX_Query_cuda_support
    except AttributeError:
        try:
            query = ctypes.CDLL("libmpi.so.40", mode=ctypes.RTLD_GLOBAL).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            return None
    query.restype = ctypes.c_int
    return CudaAwareness(bool(query()), "MPIX_Query_cuda_support()")


def _from_ompi_info(_comm):
    exe = shutil.which("ompi_info")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--parsable", "--all"], capture_output=True, text=True,
                             timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        if "mpi_built_with_cuda_support:value" in line:
            value = line.rsplit(":", 1)[1].strip()
            return CudaAwareness(value == "true", f"ompi_info: {line.strip()}")
    return None
