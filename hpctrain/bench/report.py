"""What every benchmark prints and writes: a ``#`` header, and JSON or HDF5 results.

Only rank 0 prints or writes; files are published with :func:`~hpctrain.data.atomic.atomic_path`
(temporary name, ``fsync``, rename), so a failed run never leaves half a result.
"""

import json
import os
import platform

import numpy as np

from .. import __version__, mpi_support
from ..data.atomic import atomic_path
from ..info import versions


def header_lines(title, settings, comm):
    """The ``#`` header: the command's settings, library versions and the rank -> host map.

    Collective: every rank contributes its host and PID.
    """
    import socket

    ranks = comm.gather((socket.gethostname(), os.getpid()), root=0)
    if comm.rank != 0:
        return []
    lines = [f"# hpctrain {__version__} bench {title}"]
    lines.append("# " + "  ".join(f"{key} {value}" for key, value in settings.items()))
    found = versions()
    lines.append("# " + "  ".join(f"{name} {found[name] or '-'}" for name in found))
    lines.append(f"# MPI: {mpi_support.library_version()}")
    lines.append(f"# MPI waiting: {mpi_support.describe_waiting()}")
    lines += [f"#  Rank {rank:3d} Pid {pid:7d} on {host}" for rank, (host, pid) in enumerate(ranks)]
    return lines


def environment():
    """Versions and platform, for the machine-readable outputs."""
    return {"versions": versions(), "mpi": mpi_support.library_version(),
            "mpi_waiting": mpi_support.describe_waiting(), "machine": platform.machine(),
            "cpus": os.cpu_count()}


def write_json(path, document):
    """Write ``document`` as JSON to ``path`` atomically."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")


def write_hdf5(path, name, rows, attrs, tables=None):
    """Write ``rows`` (a list of flat dicts, all with the same keys) as the table dataset
    ``name`` with ``attrs``, and each of ``tables`` (name -> rows) beside it, in one file
    written whole or not at all."""
    import h5py

    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        table = f.create_dataset(name, data=_structured(rows))
        for key, value in attrs.items():
            table.attrs[key] = json.dumps(value) if isinstance(value, (dict, list)) else value
        for other, other_rows in (tables or {}).items():
            f.create_dataset(other, data=_structured(other_rows))


def _structured(rows):
    if not rows:
        return np.zeros(0, dtype=[("empty", "i1")])
    fields = []
    for key, value in rows[0].items():
        if isinstance(value, str):
            width = max(len(row[key]) for row in rows)
            fields.append((key, f"S{max(width, 1)}"))
        elif isinstance(value, (int, np.integer)):
            fields.append((key, "i8"))
        else:
            fields.append((key, "f8"))
    return np.array([tuple(row[k] for k, _ in fields) for row in rows], dtype=fields)

