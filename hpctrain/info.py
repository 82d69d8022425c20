"""``hpctrain info``: one table describing the software, the MPI library and every rank.

Collective over ``COMM_WORLD``: every rank describes itself, rank 0 gathers and prints.
"""

import importlib.metadata
import os
import platform
import socket
from dataclasses import dataclass

from . import __version__, faults
from .options import add_arguments
from .mpi import cuda as mpi_cuda
from .mpi.library import library_version, standard_version
from .mpi.ulfm import fault_tolerance
from .mpi.waiting import describe_waiting
from .devices import node_local_rank

PACKAGES = ("torch", "mpi4py", "numpy", "h5py", "horovod")


@dataclass
class InfoConfig:
    """``hpctrain info``'s configuration: none yet. A field here (``hpctrain.options.option``)
    is its option, parsed and checked like every command's."""


def add_parser(subparsers):
    """Register the ``info`` subcommand."""
    parser = subparsers.add_parser(
        "info", help="versions, MPI library, ranks, CUDA-awareness and Horovod build",
        description="Print one table (on rank 0) with the versions of hpctrain and its "
                    "libraries, the MPI library, every rank's host, PID and GPU, whether MPI "
                    "is CUDA-aware and how Horovod was built. Run it under mpirun or srun to "
                    "check a launch before training.")
    add_arguments(parser, InfoConfig)
    parser.set_defaults(func=run)
    return parser


def run(args):
    """Gather every rank's description on rank 0 and print the table there."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    me = describe_rank(comm)
    faults.inject("info.gather", comm.rank)
    ranks = comm.gather(me, root=0)  # synchronisation point: rank 0 waits for every rank
    if comm.rank == 0:
        print(format_table(ranks, library_version(),
                           standard_version(), mpi_cuda.cuda_awareness(comm),
                           horovod_build(), fault_tolerance()), flush=True)
    faults.inject("info.done", comm.rank)
    return 0


def versions():
    """Versions of hpctrain, Python and the libraries it runs on (``None``: not installed)."""
    found = {"hpctrain": __version__, "Python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def describe_rank(comm):
    """This rank's host, PID, node-local rank, GPU and library versions (collective)."""
    local_rank = node_local_rank(comm)
    return {"rank": comm.rank, "host": socket.gethostname(), "pid": os.getpid(),
            "local_rank": local_rank, "gpu": gpu_for(local_rank), "versions": versions(),
            "driver": mpi_cuda.cuda_driver()}


def gpu_for(local_rank):
    """The GPU the usual local-rank mapping gives this rank, or ``-`` when there is none."""
    import torch

    if not torch.cuda.is_available():
        return "-"
    index = local_rank % torch.cuda.device_count()
    return f"cuda:{index} {torch.cuda.get_device_name(index)}"


def horovod_build():
    """Horovod's build as ``horovodrun --check-build`` reports it, or why it is unavailable."""
    try:
        import horovod.torch as hvd
        from horovod.common.util import extension_available
    except ImportError as exc:
        return {"error": f"not importable ({exc}); optional: scripts/setup builds it "
                         f"(unless --no-horovod), or scripts/build-horovod"}
    names = {"tensorflow": "TensorFlow", "torch": "PyTorch", "mxnet": "MXNet"}
    frameworks = [label for ext, label in names.items() if extension_available(ext)]
    controllers = [name for name, built in (("MPI", hvd.mpi_built()),
                                           ("Gloo", hvd.gloo_built())) if built]
    operations = [name for name, built in (("NCCL", hvd.nccl_built()), ("DDL", hvd.ddl_built()),
                                          ("CCL", hvd.ccl_built()), ("MPI", hvd.mpi_built()),
                                          ("Gloo", hvd.gloo_built())) if built]
    return {"frameworks": frameworks, "controllers": controllers, "operations": operations,
            "cuda": bool(hvd.cuda_built())}


def format_table(ranks, library, standard, cuda, horovod, fault_tolerance=None):
    """The ``info`` table, from every rank's ``describe_rank`` and rank 0's library facts
    (``fault_tolerance``: a :class:`~hpctrain.mpi.ulfm.FaultTolerance`, or ``None``)."""
    ours = ranks[0]["versions"]
    lines = [f"hpctrain info: {len(ranks)} rank{'s' if len(ranks) != 1 else ''}", "",
             "versions (rank 0)"]
    lines += [f"  {name:<10} {value or 'not installed'}" for name, value in ours.items()]
    differing = [r["rank"] for r in ranks if r["versions"] != ours]
    lines.append(f"  same on every rank: {'yes' if not differing else f'NO, ranks {differing}'}")
    lines += ["", f"MPI library      {library} (MPI {standard})",
              f"world size       {len(ranks)}",
              f"MPI waiting      {describe_waiting()}",
              f"MPI CUDA support {cuda}"]
    drivers = [r.get("driver") for r in ranks]
    if all(drivers):
        # The three things a device buffer handed to MPI needs, told apart.
        lines += [f"CUDA driver      {_format_drivers(drivers)}",
                  f"GPUs visible     {_format_gpus(drivers)}"]
        ok, missing = mpi_cuda.device_memory_verdict(cuda, drivers)
        word = {True: "yes", False: "no", None: "unknown"}[ok]
        lines.append(f"device buffers   {word}{': ' + missing if missing else ''} "
                     f"(MPI gets CUDA memory only with all three)")
    lines[-1] += _staging_hint(cuda, ranks)
    if fault_tolerance is not None:
        # Whether survivors of a lost rank can go on in place (elastic training, ULFM).
        lines.append(f"MPI ULFM         {'yes' if fault_tolerance.available else 'no'} "
                     f"({fault_tolerance.detail})")
    lines += ["Horovod build    " + _format_horovod(horovod), "", _format_ranks(ranks)]
    return "\n".join(lines)


def _format_drivers(drivers):
    details = sorted({d.detail for d in drivers})
    if len(details) == 1:
        return ("yes, " if drivers[0].present else "no, ") + details[0]
    return "; ".join(f"rank(s) {[r for r, d in enumerate(drivers) if d.detail == text]}: "
                     f"{text}" for text in details)


def _format_gpus(drivers):
    counts = sorted({d.gpus for d in drivers})
    if counts == [0]:
        return "none"
    if len(counts) == 1:
        return f"{counts[0]} per rank"
    return ", ".join(f"rank {r}: {d.gpus}" for r, d in enumerate(drivers))


def _staging_hint(cuda, ranks):
    # Ranks with a GPU and an MPI not known to take device memory: say what that costs and
    # where the remedy is.
    if getattr(cuda, "aware", None) is True or all(r["gpu"] == "-" for r in ranks):
        return ""
    return ("; GPU data is staged through host memory (scripts/build-cuda-mpi builds a "
            "CUDA-aware Open MPI, docs/gpu.md)")


def _format_horovod(build):
    if "error" in build:
        return build["error"]
    def names(key):
        return ", ".join(build[key]) or "none"
    return (f"frameworks: {names('frameworks')}; controllers: {names('controllers')}; "
            f"tensor operations: {names('operations')}; CUDA: {'yes' if build['cuda'] else 'no'}")


def _format_ranks(ranks):
    host_width = max(len("host"), *(len(r["host"]) for r in ranks))
    rows = [f"{'rank':>4}  {'host':<{host_width}}  {'pid':>7}  {'local':>5}  gpu"]
    rows += [f"{r['rank']:>4}  {r['host']:<{host_width}}  {r['pid']:>7}  {r['local_rank']:>5}  "
             f"{r['gpu']}" for r in ranks]
    return "\n".join(rows)
