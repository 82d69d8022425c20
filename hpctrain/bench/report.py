"""What every benchmark prints and writes: a ``#`` header, the collectives' table in
nccl-tests' columns and its footer, and JSON or HDF5 results.

Only rank 0 prints or writes; files are published with :func:`~hpctrain.data.atomic.atomic_path`
(temporary name, ``fsync``, rename), so a failed run never leaves half a result.
"""

import json
import os
import platform

import numpy as np

from .. import __version__
from ..data.atomic import atomic_path
from ..info import versions
from ..mpi.library import library_version
from ..mpi.waiting import describe_waiting

#: The columns of a collective's table, as its JSON and HDF5 outputs name them.
COLUMNS = ("size", "count", "type", "redop", "algo", "time_min_us", "time_avg_us",
           "time_max_us", "time_median_us", "algbw_GBps", "busbw_GBps", "wrong")


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
    lines.append(f"# MPI: {library_version()}")
    lines.append(f"# MPI waiting: {describe_waiting()}")
    lines += [f"#  Rank {rank:3d} Pid {pid:7d} on {host}" for rank, (host, pid) in enumerate(ranks)]
    return lines


def format_row(row):
    """One line of the table, in nccl-tests' column order."""
    wrong = "N/A" if row["wrong"] < 0 else row["wrong"]
    return (f"{row['size']:>12} {row['count']:>11} {row['type']:>8} {row['redop']:>5} "
            f"{row['algo']:>10} {row['time_min_us']:>10.1f} {row['time_avg_us']:>10.1f} "
            f"{row['time_max_us']:>10.1f} {row['algbw_GBps']:>7.3f} {row['busbw_GBps']:>7.3f} "
            f"{wrong:>6}")


def column_header():
    """The table's two heading lines (names, units), after a ``#`` line."""
    return ["#",
            f"# {'size':>10} {'count':>11} {'type':>8} {'redop':>5} {'algo':>10} "
            f"{'time-min':>10} {'time-avg':>10} {'time-max':>10} {'algbw':>7} {'busbw':>7} "
            f"{'#wrong':>6}",
            f"# {'(B)':>10} {'(elements)':>11} {'':>8} {'':>5} {'':>10} {'(us)':>10} "
            f"{'(us)':>10} {'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"]


def footer_lines(rows, algos, wrong, checked):
    """nccl-tests' footer: wrong-value total, then average bus bandwidth per algorithm."""
    verdict = "N/A (no check, -c 0)" if not checked else \
        f"{wrong} {'OK' if wrong == 0 else 'FAILED'}"
    lines = [f"# Out of bounds values : {verdict}", "# Avg bus bandwidth (GB/s):"]
    for algo in algos:
        values = [row["busbw_GBps"] for row in rows if row["algo"] == algo]
        lines.append(f"#   {algo:<12} {np.mean(values) if values else 0.0:.3f}")
    return lines


def environment():
    """Versions and platform, for the machine-readable outputs."""
    return {"versions": versions(), "mpi": library_version(),
            "mpi_waiting": describe_waiting(), "machine": platform.machine(),
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

