"""Whether the MPI library under mpi4py accepts GPU buffers (CUDA-aware), and whether this
process has a CUDA driver and a GPU to hand it.

mpi4py itself has no CUDA-awareness query. We ask, in order of trust:

1. the MPI 4.1 ``mpi_memory_alloc_kinds`` info key of ``COMM_WORLD`` (MPICH 4.2+, Open MPI 5+);
2. Open MPI's extension ``MPIX_Query_cuda_support()``, looked up in the loaded library, which
   answers for the running library (a CUDA-built Open MPI may still have CUDA disabled);
3. Open MPI's ``ompi_info --parsable --all`` (``mpi_built_with_cuda_support:value``), which
   answers for how the library was built.

The first method that gives an answer decides; the answer carries the method's name.

That answers for the library only. A device buffer can be handed to MPI when, besides, a
CUDA driver is installed and starts (:func:`cuda_driver`, asked through the driver API itself,
whatever torch was built for) and this process sees a GPU: :func:`device_memory_verdict`
puts the three together and names what is missing.
"""

import ctypes
import shutil
import subprocess
from dataclasses import dataclass

from .library import library_version


@dataclass(frozen=True)
class CudaAwareness:
    """Whether MPI accepts CUDA device buffers (``None``: could not tell) and how we know."""

    aware: object
    method: str

    def __str__(self):
        word = {True: "yes", False: "no", None: "unknown"}[self.aware]
        return f"{word} ({self.method})"


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


@dataclass(frozen=True)
class CudaDriver:
    """Whether the CUDA driver loads and starts in this process, and how many GPUs it sees
    (``CUDA_VISIBLE_DEVICES`` applied); ``detail`` says what was found or what failed."""

    present: bool
    gpus: int
    detail: str


def cuda_driver():
    """Ask the CUDA driver API (``libcuda.so.1``, installed with the NVIDIA driver) directly:
    loaded, ``cuInit(0)`` succeeded, its version and ``cuDeviceGetCount``."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return CudaDriver(False, 0, "libcuda.so.1 not found: no NVIDIA driver")
    status = lib.cuInit(0)
    if status != 0:
        return CudaDriver(False, 0, f"cuInit(0) failed with CUDA error {status}")
    version, count = ctypes.c_int(0), ctypes.c_int(0)
    lib.cuDriverGetVersion(ctypes.byref(version))
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        count.value = 0
    return CudaDriver(True, count.value, f"CUDA driver API {version.value // 1000}."
                                         f"{version.value % 1000 // 10}")


def device_memory_verdict(awareness, drivers):
    """``(True, "")`` when a device buffer can be handed to MPI on every rank: the library is
    CUDA-aware, and every rank's driver (``drivers``: a :class:`CudaDriver` per rank) starts
    and sees a GPU; else ``(False or None, what is missing)``."""
    missing = []
    if awareness.aware is not True:
        missing.append("the MPI library is not built CUDA-aware" if awareness.aware is False
                       else "whether the MPI library is CUDA-aware is unknown")
    without_driver = [r for r, d in enumerate(drivers) if not d.present]
    without_gpu = [r for r, d in enumerate(drivers) if d.present and d.gpus == 0]
    for ranks, what in ((without_driver, "no CUDA driver"), (without_gpu, "no GPU visible")):
        if ranks:
            where = "" if len(ranks) == len(drivers) else f" on rank(s) {ranks}"
            missing.append(what + where)
    if not missing:
        return True, ""
    return (None if awareness.aware is None and len(missing) == 1 else False), "; ".join(missing)
