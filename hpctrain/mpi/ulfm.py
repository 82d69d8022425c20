"""ULFM, MPI's fault tolerance (revoke, shrink, agree): whether this Python's mpi4py and MPI
have it, told without initialising MPI (the elastic launcher asks before any rank exists), and
the calls a survivor makes with it: :func:`process_failure` (does an error say a rank died?),
:func:`revoke`, :func:`shrink`. None of them imports mpi4py: they take its objects."""

import json
import struct
import subprocess
import sys
from typing import NamedTuple

#: What an elastic job calls to go on without a lost rank (ULFM). mpi4py calls these only
#: when built against an MPI whose ``mpi-ext.h`` enables ``ftmpi`` (or, in its binary wheels,
#: as weak symbols, when the library it loads has them); otherwise its stand-ins call none:
#: Revoke raises, Shrink is a Dup, Agree an Allreduce.
ULFM_SYMBOLS = ("MPIX_Comm_revoke", "MPIX_Comm_shrink", "MPIX_Comm_agree")

def process_failure(exc):
    """True when ``exc`` is MPI's report that a rank died, or that a communicator was revoked
    because one did. Only an MPI with fault tolerance reports these (without it the error
    classes are all ``ERR_UNKNOWN``, which this does not take for one)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not isinstance(exc, mpi.Exception):
        return False
    classes = {mpi.ERR_PROC_FAILED, mpi.ERR_PROC_FAILED_PENDING, mpi.ERR_REVOKED}
    return exc.Get_error_class() in classes - {mpi.ERR_UNKNOWN}


def revoke(comm):
    """Revoke ``comm`` after a rank died, so that every survivor's operation on it fails at
    once instead of waiting for a rank that has died or has gone on to the recovery. Any rank
    may call it, any number of times: a communicator revoked or freed already is left as it
    is."""
    try:
        comm.Revoke()
    except Exception:  # noqa: BLE001,S110 - revoked (by another rank) or freed: nothing to do
        pass


def shrink(comm):
    """The survivors' communicator of ``comm`` after a rank died: ``comm`` revoked (so that no
    survivor is left waiting in it), then ``MPI_Comm_shrink``. Collective over the survivors,
    each of which arrives from its own failed operation."""
    revoke(comm)
    return comm.Shrink()


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
