"""``hpctrain bench torch-distributed``: the ``hpctrain`` backend of torch.distributed beside
torch's own backend for the device (gloo for CPU tensors, NCCL for CUDA ones), in one run.

    mpirun -np 4 python -m hpctrain bench torch-distributed --rounds 5
    mpirun -np 2 python -m hpctrain bench torch-distributed --device cuda    # beside NCCL

Both process groups live in every rank at once: the default group is ``hpctrain``
(``dist.init_process_group("hpctrain")``), and the other is built beside it on a store that
the ranks meet at through MPI (:func:`peer_group`); the settings name the class that served
each (``served_by``). Each round times
every collective at every size on both, in alternating order (hpctrain first in even
rounds, the other first in odd ones), so that whatever else the machine does falls on both
alike; the table gives the median over the rounds of each rank's slowest time (on a GPU, up
to the device's end of the last call). Then the training throughput of DDP and of FSDP2
(``fully_shard``), the same model and batches on either group, rounds alternated likewise.
``--against none`` times hpctrain alone (NCCL before 2.30 refuses two ranks on one GPU).

Collectives: ``all_reduce`` (busbw = algbw * 2(p-1)/p), ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` (busbw = algbw * (p-1)/p; size: the whole vector), float32 SUM.
Correctness is checked in a separate pass on integer-valued data (exact in any order); a
wrong value makes the exit status 1. Rank 0 prints; ``--json`` writes the rows.
"""

import datetime
import statistics
import time

from ..options import add_arguments as add_options
from .config import AGAINST, TorchDistributedBench
from .report import environment, header_lines, write_json
from ..units import parse_size
from .sizes import format_size

COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")


def add_arguments(parser):
    """The command's options (:class:`~.config.TorchDistributedBench`)."""
    add_options(parser, TorchDistributedBench)


def init_groups(comm, against, device):
    """``{backend: group}`` (collective): the default group over ``hpctrain`` and, unless
    ``against`` is ``none``, a group of torch's ``against`` beside it (:func:`peer_group`)."""
    import torch.distributed as dist

    dist.init_process_group("hpctrain")
    groups = {"hpctrain": dist.group.WORLD}
    if against != "none":
        groups[against] = peer_group(comm, against, device)
    return groups


def peer_group(comm, backend, device, timeout_s=300):
    """A process group of torch's ``backend`` (``gloo`` or ``nccl``) over ``comm``'s ranks,
    beside the default group (collective): torch's own ``ProcessGroup`` wrapping the
    backend's, on a store the ranks meet at through MPI, as ``init_process_group`` builds
    one, and registered with torch's world as ``new_group`` registers its groups, so that
    DDP, FSDP2 and ``DeviceMesh`` take it. Not ``new_group(backend=...)``: torch hands every
    ``new_group`` to a default group that makes groups itself, as ``hpctrain``'s does."""
    import torch
    import torch.distributed as dist

    from ..torch.ddp import rendezvous

    store = rendezvous(comm, datetime.timedelta(seconds=timeout_s))
    rank, size = comm.Get_rank(), comm.Get_size()
    kind = {"gloo": dist.ProcessGroup.BackendType.GLOO,
            "nccl": dist.ProcessGroup.BackendType.NCCL}[backend]
    made = {"gloo": lambda s: dist.ProcessGroupGloo(s, rank, size),
            "nccl": lambda s: dist.ProcessGroupNCCL(s, rank, size)}[backend]
    group = dist.ProcessGroup(dist.PrefixStore("group", store), rank, size)
    group._set_default_backend(kind)
    group._register_backend(torch.device(device.type), kind,
                            made(dist.PrefixStore(backend, store)))
    name = f"hpctrain-bench-{backend}"
    group._set_group_name(name)
    dist.distributed_c10d._register_pg_in_world(
        group, backend_name=backend, store=store, group_name=name, backend_config=backend,
        rank_mapping={r: r for r in range(size)})
    return group


def backend_of(group, device):
    """The class name of the backend that serves ``group`` on ``device`` (what ran): a
    ``ProcessGroup`` of torch's names its registered backend; a Python one (ours) serves
    itself."""
    import torch

    try:
        return type(group._get_backend(torch.device(device.type))).__name__
    except RuntimeError:            # no backend registered: the group is its own
        return type(group).__name__


def calls(group, count, size, device):
    """``{collective: (call(), check())}`` over ``group`` for ``count`` float32 elements
    (the whole vector) on ``device``, on buffers made once; ``check()`` says whether the last
    call's result was exact (the inputs are small integers)."""
    import torch
    import torch.distributed as dist

    rank = group.rank()
    per = count // size
    reduced = torch.empty(count, device=device)
    whole = torch.empty(per * size, device=device)
    shard = torch.full((per,), float(rank + 1), device=device)
    scatter_in = torch.empty(per * size, device=device)
    scatter_out = torch.empty(per, device=device)
    total = size * (size + 1) / 2

    def all_reduce():
        reduced.fill_(rank + 1)
        group.allreduce([reduced], dist.AllreduceOptions()).wait()

    def all_gather():
        group._allgather_base(whole, shard).wait()

    def reduce_scatter():
        scatter_in.fill_(rank + 1)
        group._reduce_scatter_base(scatter_out, scatter_in).wait()

    blocks = torch.arange(1, size + 1, dtype=torch.float32,
                          device=device).repeat_interleave(per)
    return {"all_reduce": (all_reduce, lambda: bool((reduced == total).all())),
            "all_gather_into_tensor": (all_gather, lambda: bool(torch.equal(whole, blocks))),
            "reduce_scatter_tensor": (reduce_scatter,
                                      lambda: bool((scatter_out == total).all()))}


def bus_factor(collective, size):
    """nccl-tests' busbw factor of ``collective`` at ``size`` ranks."""
    return (2 if collective == "all_reduce" else 1) * (size - 1) / size


def timed(comm, call, iters, device):
    """The slowest rank's seconds per call of ``iters`` calls (collective), up to the end of
    the last one on ``device`` (a CUDA collective's ``wait`` only orders the stream)."""
    import torch
    from mpi4py import MPI

    def finished():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    finished()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    finished()
    return comm.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX)


#: The data-parallel wrappers whose training throughput the benchmark times.
WRAPPERS = ("DDP", "FSDP2")


def step_maker(wrapper, group, steps, device):
    """``run()``: ``steps`` training steps of ``wrapper`` (DDP, or FSDP2's ``fully_shard`` of
    each layer and of the whole, on a mesh over ``group``) over ``group``, on the same model
    and batches whichever the group (a 4-layer MLP of 1024 wide, 32 rows per rank), on
    ``device``."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
    if wrapper == "DDP":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None, process_group=group)
    else:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(group, device.type)
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(group.rank())
    x = torch.randn(32, 256, generator=generator).to(device)
    y = torch.randint(0, 10, (32,)).to(device)

    def run():
        for _ in range(steps):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    return run


def run(args, comm):
    """The benchmark (collective); True if any result was wrong."""
    import torch
    import torch.distributed as dist

    import hpctrain.torch.distributed  # noqa: F401 - registers the backend

    from ..devices import rank_device
    from ..torch import algorithm

    against = args.against or AGAINST[args.device]
    check_arguments(args, against, comm)
    torch.set_num_threads(1)
    device = rank_device(args.device, comm)
    groups = init_groups(comm, against, device)
    size = comm.Get_size()
    backends = tuple(groups)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    settings = {"ranks": size, "algorithm": algorithm(), "device": args.device,
                "against": against, "rounds": args.rounds, "iters": args.iters,
                "dtype": "float32", "op": "sum",
                "served_by": {name: backend_of(group, device) for name, group in groups.items()}}
    lines = header_lines("torch-distributed", settings, comm)
    wrong = {}
    times = {}          # (collective, bytes, backend) -> seconds per call, one per round
    for nbytes in sizes:
        count = nbytes // 4 // size * size
        made = {name: calls(group, count, size, device) for name, group in groups.items()}
        for name in backends:           # warm-up and the correctness pass
            for collective, (call, check) in made[name].items():
                call()
                wrong[(collective, nbytes, name)] = not comm.allreduce(check(),
                                                                       op=_land())
        for round_ in range(args.rounds):
            order = backends if round_ % 2 == 0 else backends[::-1]
            for collective in COLLECTIVES:
                for name in order:
                    seconds = timed(comm, made[name][collective][0], args.iters, device)
                    times.setdefault((collective, nbytes, name), []).append(seconds)
    rows = [_row(c, n, b, statistics.median(times[(c, n, b)]), size, wrong[(c, n, b)])
            for c in COLLECTIVES for n in sizes for b in backends]
    training = _training_rows(args, comm, groups, size, device) if args.train_steps else []
    if comm.Get_rank() == 0:
        _print(lines, rows, training)
        if args.json:
            write_json(args.json, {"settings": settings, "environment": environment(),
                                   "collectives": rows, "training": training})
    dist.destroy_process_group()
    return any(wrong.values())


def check_arguments(args, against, comm):
    """A :class:`~hpctrain.errors.Verdict` on every rank for options this run cannot take
    (the counts' ranges are :class:`~.config.TorchDistributedBench`'s): CUDA asked where
    torch sees no GPU, gloo for CUDA tensors (NCCL's) or NCCL for CPU ones, NCCL where it
    would refuse ranks that share a GPU.

    Synchronisation points: the node split (``--against nccl``) and one allgather."""
    import torch

    from .. import gpu_checks
    from ..devices import ranks_on_node
    from ..errors import UsageError
    from ..runtime import checks

    on_node = ranks_on_node(comm) if against == "nccl" else 0
    with checks(comm):
        if against not in ("none", AGAINST[args.device]):
            raise UsageError(f"--against {against} does not take {args.device} tensors: use "
                             f"--against {AGAINST[args.device]} (or none) with --device "
                             f"{args.device}")
        if args.device == "cuda":
            gpu_checks.check_cuda_visible("--device cuda")
        if against == "nccl":
            major, minor, patch = torch.cuda.nccl.version()
            problem = gpu_checks.nccl_shared_gpu_problem(
                major * 10000 + minor * 100 + patch, on_node, torch.cuda.device_count(),
                "--against nccl", user="torch's nccl backend runs",
                instead="time hpctrain alone (--against none)")
            if problem:
                raise UsageError(problem)


def _land():
    from mpi4py import MPI

    return MPI.LAND


def _row(collective, nbytes, backend, seconds, size, wrong):
    algbw = nbytes / seconds / 1e9
    return {"collective": collective, "bytes": nbytes, "backend": backend,
            "time_us": seconds * 1e6, "algbw_GBs": algbw,
            "busbw_GBs": algbw * bus_factor(collective, size), "wrong": int(wrong)}


def _training_rows(args, comm, groups, size, device):
    """Each wrapper's throughput over each group: rounds alternated between the groups,
    the median round (collective)."""
    backends = tuple(groups)
    rows = []
    for wrapper in WRAPPERS:
        makers = {name: step_maker(wrapper, group, args.train_steps, device)
                  for name, group in groups.items()}
        for name in backends:
            makers[name]()              # warm-up: DDP rebuilds its buckets after a step
        seconds = {}
        for round_ in range(args.rounds):
            for name in (backends if round_ % 2 == 0 else backends[::-1]):
                seconds.setdefault(name, []).append(timed(comm, makers[name], 1, device))
        rows += [{"wrapper": wrapper, "backend": name, "steps": args.train_steps,
                  "rows_per_rank": 32,
                  "samples_per_s": size * 32 * args.train_steps / statistics.median(seconds[name])}
                 for name in backends]
    return rows


def _print(lines, rows, training):
    print("\n".join(lines))
    print(f"# {'collective':>24} {'size':>8} {'backend':>9} {'time(us)':>11} "
          f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>7}")
    for r in rows:
        print(f"  {r['collective']:>24} {format_size(r['bytes']):>8} {r['backend']:>9} "
              f"{r['time_us']:11.1f} {r['algbw_GBs']:12.3f} {r['busbw_GBs']:12.3f} "
              f"{r['wrong']:7d}")
    for r in training:
        print(f"# {r['wrapper']:>5} {r['backend']:>9}: {r['samples_per_s']:9.1f} samples/s "
              f"({r['rows_per_rank']} rows per rank, {r['steps']} steps per round)")
    print(f"# wrong results: {sum(r['wrong'] for r in rows)}", flush=True)
