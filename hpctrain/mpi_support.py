"""What the MPI library under mpi4py is, whether it accepts GPU buffers (CUDA-aware), and
whether it survives a lost rank (ULFM: :func:`fault_tolerance`).

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
import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from typing import NamedTuple

#: Open MPI's setting for how a rank waits inside MPI: ``1`` yields its core
#: (``sched_yield``) between polls of the network, ``0`` spins on it.
YIELD_WHEN_IDLE = "OMPI_MCA_mpi_yield_when_idle"
#: Where launchers say how many ranks of the job run on this node: Open MPI's mpirun,
#: MPICH's Hydra, Slurm (with ``--ntasks-per-node``).
LOCAL_SIZE_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE")
#: Set beside :data:`YIELD_WHEN_IDLE` when hpctrain chose it, with the reason: a launch
#: started from this process (``hpctrain.launch``) drops both, its ranks decide afresh.
WAIT_POLICY = "HPCTRAIN_WAIT_POLICY"


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


def local_ranks(environ):
    """How many ranks of this job run on this node, as the launcher says (``None``: unknown)."""
    for name in LOCAL_SIZE_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def wait_policy(environ, cores):
    """``(yield_when_idle, why)``: whether ranks should yield their core while MPI waits.

    Every rank of hpctrain.torch (and of Horovod) runs two busy threads: the one computing
    and the communication thread. A rank that waits in MPI spins on a core by default,
    which is right when every thread has a core of its own; when the node's ranks times two
    outnumber the ``cores`` this process may run on, the spinning thread takes the core from
    backward, of its own rank or another's (docs/training.md measures it). Open MPI yields
    by itself only when it counts more ranks than slots, which it never does for threads.
    ``yield_when_idle`` is ``None`` when the user has set the variable (theirs wins) or the
    number of local ranks is unknown.
    """
    if YIELD_WHEN_IDLE in environ:
        return None, environ.get(WAIT_POLICY, "set by the user")
    ranks = local_ranks(environ)
    if ranks is None:
        return None, "ranks per node unknown: Open MPI's default"
    threads = 2 * ranks
    why = f"{ranks} rank(s) on this node x 2 busy threads {'>' if threads > cores else '<='} " \
          f"{cores} core(s)"
    return threads > cores, why


def apply_wait_policy(environ=None, cores=None):
    """Set :data:`YIELD_WHEN_IDLE` to ``1`` in ``environ`` (default ``os.environ``, before
    ``MPI_Init`` reads it) when :func:`wait_policy` says so (otherwise Open MPI's default
    stands); return its ``(decision, why)``."""
    environ = os.environ if environ is None else environ
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    decision, why = wait_policy(environ, cores)
    if decision:
        environ[YIELD_WHEN_IDLE] = "1"
        environ[WAIT_POLICY] = why
    return decision, why


def describe_waiting(environ=None):
    """How this process's MPI waits, in words (for ``hpctrain info`` and benchmark headers)."""
    environ = os.environ if environ is None else environ
    value = environ.get(YIELD_WHEN_IDLE)
    if value is None:
        return "Open MPI's default (spins unless it counts more ranks than slots)"
    mode = {"1": "yields the core", "0": "spins"}.get(value, "as Open MPI reads it")
    return f"{mode} (mpi_yield_when_idle={value}: {environ.get(WAIT_POLICY, 'set by the user')})"


#: What an elastic job calls to go on without a lost rank (ULFM). mpi4py calls these only
#: when built against an MPI whose ``mpi-ext.h`` enables ``ftmpi`` (or, in its binary wheels,
#: as weak symbols, when the library it loads has them); otherwise its stand-ins call none:
#: Revoke raises, Shrink is a Dup, Agree an Allreduce.
ULFM_SYMBOLS = ("MPIX_Comm_revoke", "MPIX_Comm_shrink", "MPIX_Comm_agree")

#: Run by :func:`fault_tolerance` in a Python of its own: loads mpi4py.MPI as a rank would
#: (mpi4py's search for the library, RUNPATH, LD_LIBRARY_PATH) without MPI_Init, and says
#: which files that took.
_LOAD_PROBE = """
import json, re, mpi4py
mpi4py.rc.initialize = mpi4py.rc.finalize = False
from mpi4py import MPI
maps = [line.split()[-1] for line in open("/proc/self/maps")]
lib = [path for path in maps if re.search(r"/libmpi(ch|_cray)?\\.so", path)]
print(json.dumps({"module": MPI.__file__, "libmpi": (lib or [None])[0],
                  "version": mpi4py.__version__,
                  "library": MPI.Get_library_version().split(",")[0].strip("\\0 \\n")}))
"""


class FaultTolerance(NamedTuple):
    """Whether this Python's mpi4py and MPI can revoke and shrink a communicator (ULFM), and
    what the answer rests on (or what is missing)."""

    available: bool
    detail: str


def fault_tolerance(python=None):
    """Whether mpi4py under ``python`` (default: this one) can revoke and shrink (ULFM),
    told without initialising MPI anywhere: the elastic launcher asks before any rank exists.

    A Python of its own loads ``mpi4py.MPI`` without ``MPI_Init`` (0.1 s) to learn which
    extension module and ``libmpi`` a rank would load; then the files tell: the module must
    call :data:`ULFM_SYMBOLS` and the library define them. At run time Open MPI also needs
    ``mpirun --with-ft ulfm``: without it a lost rank ends the job.
    """
    try:
        loaded = _load_mpi4py(python or sys.executable)
    except RuntimeError as error:
        return FaultTolerance(False, str(error))
    name = f"mpi4py {loaded['version']} on {loaded['library']}"
    if not loaded["libmpi"]:
        return FaultTolerance(False, f"{name}: no libmpi found among what it loaded")
    try:
        _, calls = elf_symbols(loaded["module"])
        defined, _ = elf_symbols(loaded["libmpi"])
    except (OSError, ValueError) as error:
        return FaultTolerance(False, f"{name}: cannot read its symbols ({error})")
    if not all(symbol in calls for symbol in ULFM_SYMBOLS):
        return FaultTolerance(False, f"{name}: mpi4py was built without ULFM (its MPI has "
                                     f"no ftmpi extension); scripts/setup --ft builds one")
    lacking = [symbol for symbol in ULFM_SYMBOLS if symbol not in defined]
    if lacking:
        return FaultTolerance(False, f"{name}: {loaded['libmpi']} has no {', '.join(lacking)} "
                                     f"(another MPI first on LD_LIBRARY_PATH?)")
    return FaultTolerance(True, f"{name}: revoke, shrink, agree ({loaded['libmpi']}); "
                                f"run under mpirun --with-ft ulfm")


def _load_mpi4py(python):
    try:
        done = subprocess.run([python, "-c", _LOAD_PROBE], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"cannot run {python}: {error}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"mpi4py.MPI does not load in {python}: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


#: ELF section type of the dynamic symbol table.
_SHT_DYNSYM = 11


def elf_symbols(path):
    """``(defined, undefined)``: the names in the dynamic symbol table of the ELF file
    ``path`` (a shared library, an extension module): those it provides, those it calls
    (weak ones included). ``ValueError`` for a file that is not ELF or has no such table."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        raise ValueError(f"{path} is not an ELF file")
    order = "<" if data[5] == 1 else ">"
    if data[4] == 2:         # 64-bit: section headers, symbol entries
        table, size, count = struct.unpack_from(order + "Q10xHH", data, 0x28)
        header, symbol = order + "4xI16xQQI12xQ", order + "IxxH"
    else:
        table, size, count = struct.unpack_from(order + "I10xHH", data, 0x20)
        header, symbol = order + "4xI8xIII8xI", order + "I10xH"
    # Each section header as (type, offset, size, link, entry size).
    sections = [struct.unpack_from(header, data, table + i * size) for i in range(count)]
    dynsym = [section for section in sections if section[0] == _SHT_DYNSYM]
    if not dynsym:
        raise ValueError(f"{path} has no dynamic symbol table")
    _, offset, length, link, entry = dynsym[0]
    strings = sections[link][1]
    defined, undefined = set(), set()
    for at in range(offset + entry, offset + length, entry):   # entry 0 is the null symbol
        name, index = struct.unpack_from(symbol, data, at)     # st_name; st_shndx, 0: undefined
        start = strings + name
        (defined if index else undefined).add(data[start:data.index(b"\0", start)].decode())
    return defined, undefined


def start(required=None):
    """mpi4py's ``MPI`` module, with MPI started: by mpi4py at import (its default), or here
    when the script set ``mpi4py.rc.initialize = False`` first (as Horovod's documentation
    shows), at ``required`` (default ``MPI_THREAD_MULTIPLE``) and finalised at exit (after
    any shutdown registered later, since ``atexit`` runs in reverse).

    Returns ``(MPI, why)``: ``why`` says what MPI gave when it gave less than ``required``
    (``None`` otherwise). A finalised MPI cannot start again: ``RuntimeError`` saying so.
    """
    import atexit

    import mpi4py
    from mpi4py import MPI

    required = MPI.THREAD_MULTIPLE if required is None else required
    if MPI.Is_finalized():
        raise RuntimeError("MPI has been finalized in this process and cannot start again: "
                           "init must come before MPI.Finalize()")
    if not MPI.Is_initialized():
        MPI.Init_thread(required)
        if not mpi4py.rc.finalize:
            atexit.register(lambda: MPI.Is_finalized() or MPI.Finalize())
    provided = MPI.Query_thread()
    if provided >= required:
        return MPI, None
    names = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
             MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED",
             MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE"}
    return MPI, (f"MPI gives {names.get(provided, provided)}, less than "
                 f"{names.get(required, required)}: the communication thread calls MPI beside "
                 f"this one, so a script that calls MPI itself while operations are in "
                 f"flight may crash (build MPI with thread support, or start it with "
                 f"MPI.Init_thread(MPI.THREAD_MULTIPLE))")
