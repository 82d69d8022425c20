"""Horovod scripts' habits under hpctrain.torch, one per mode; every rank checks what it got,
rank 0 prints one line per check, and the job exits 1 where any rank found a difference.

    mpirun -np 3 python tests/programs/horovod_habits.py MODE

- ``uninit``: ``mpi4py.rc.initialize = False`` before ``hvd.init()``, which starts MPI;
- ``split``: ``init(process_sets=[ProcessSet(COMM_WORLD.Split(rank % 2))])``, each rank naming
  its own communicator; the sets are numbered as Horovod numbers them, each reduces among its
  own ranks, a duplicate raises ``ValueError`` and a second ``init`` with a right list works;
- ``dynamic``: ``add_process_set(ProcessSet(subcomm))`` after ``init``, every rank its own;
- ``comm-list``: ``init(comm=[...])`` over all ranks but the last, which is refused;
- ``timeline``: ``HOROVOD_TIMELINE`` (and ``_MARK_CYCLES``) set by the launch: rank 0 writes it;
- ``bad-set``: a process set naming a rank outside the world: status 2 on every rank;
- ``stall-shutdown``: ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=1`` set by the launch, and rank 1
  late by 4 s: every rank's operation fails with Horovod's "shut down".
"""

import json
import os
import sys

import mpi4py

mode = sys.argv[1]
if mode == "uninit":
    mpi4py.rc.initialize = False

import torch  # noqa: E402

import hpctrain.torch as hvd  # noqa: E402


def check(what, ok, got):
    """Every rank's verdict on ``what``, printed by rank 0 with the ranks that failed."""
    from mpi4py import MPI
    bad = [r for r, fine in enumerate(MPI.COMM_WORLD.allgather(bool(ok))) if not fine]
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"{'ok' if not bad else 'FAILED'} {what}" + (f" (ranks {bad}: {got})" if bad else ""),
              flush=True)
    return not bad


def total(process_set=hvd.global_process_set):
    """The sum of the world ranks + 1 of ``process_set``, by an allreduce on it."""
    t = torch.tensor([float(hvd.rank() + 1)])
    return hvd.allreduce(t, op=hvd.Sum, process_set=process_set).item()


def my_half():
    """``(rank, size, communicator)``: COMM_WORLD split into its even and its odd ranks."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    return rank, world.Get_size(), world.Split(rank % 2, key=rank)


def sums_right(what, process_set=hvd.global_process_set):
    """Check an allreduce on ``process_set`` (its ranks, once registered)."""
    got = total(process_set)
    return check(what, got == sum(r + 1 for r in process_set.ranks), got)


def uninit():
    from mpi4py import MPI
    before = MPI.Is_initialized()
    hvd.init()
    ok = [check("MPI was not started before init", not before, before)]
    ok.append(check("init started MPI at MPI_THREAD_MULTIPLE",
                    MPI.Query_thread() == MPI.THREAD_MULTIPLE, MPI.Query_thread()))
    ok.append(sums_right("a sum over the world"))
    return all(ok)


def split():
    from mpi4py import MPI
    rank, size, sub = my_half()
    clone = MPI.COMM_WORLD.Dup()
    ok = []
    try:
        hvd.init(process_sets=[hvd.ProcessSet(sub), hvd.ProcessSet(clone)])
        raised = None
    except ValueError as exc:
        raised = exc
    ok.append(check("a clone of the world is a duplicate: ValueError", raised is not None,
                    raised))
    mine = hvd.ProcessSet(sub)
    hvd.init(process_sets=[mine])
    evens, odds = list(range(0, size, 2)), list(range(1, size, 2))
    ok.append(check("each rank's set has the ranks of its communicator",
                    mine.ranks == (evens if rank % 2 == 0 else odds), mine))
    want_id = 1 if rank % 2 == 0 else 2
    ok.append(check("sets numbered as Horovod: the evens 1, the odds 2",
                    mine.process_set_id == want_id, mine.process_set_id))
    ok.append(sums_right("a sum over each set", mine))
    ok.append(check("the global set is the world's", hvd.global_process_set.ranks ==
                    list(range(size)), hvd.global_process_set))
    ok.append(sums_right("a sum over the world still"))
    return all(ok)


def dynamic():
    rank, size, sub = my_half()
    hvd.init()
    mine = hvd.add_process_set(hvd.ProcessSet(sub))
    ok = [check("add_process_set of each rank's communicator",
                mine.ranks == list(range(rank % 2, size, 2)), mine)]
    ok.append(sums_right("a sum over each set", mine))
    try:
        hvd.add_process_set(hvd.ProcessSet(my_half()[2]))
        raised = None
    except ValueError as exc:
        raised = exc
    ok.append(check("the same sets again: ValueError on every rank", raised is not None,
                    raised))
    ok.append(check("removed", hvd.remove_process_set(mine), mine))
    return all(ok)


def comm_list():
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    members = list(range(max(size - 1, 1)))
    if rank in members:
        hvd.init(comm=members)
        got = total()
        fine = hvd.size() == len(members) and got == sum(r + 1 for r in members)
        hvd.shutdown()
    else:
        try:
            hvd.init(comm=members)
            fine = False
        except ValueError as exc:
            fine = "not in" in str(exc)
            got = exc
    return check(f"init(comm={members})", fine, got)


def timeline():
    hvd.init()
    rank = hvd.rank()
    summed = sums_right("a sum over the world")
    path = os.environ["HOROVOD_TIMELINE"]
    hvd.shutdown()              # the engine ends: the file is complete
    names = set()
    if rank == 0:
        with open(path) as f:
            names = {e.get("name") for e in json.load(f)}
    wrote = {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "CYCLE_START"} <= names or rank != 0
    return summed and check("rank 0 wrote the timeline, with its cycles marked", wrote,
                            sorted(map(str, names)))


def stall_shutdown():
    import time
    hvd.init()
    start = time.monotonic()
    if hvd.rank() == 1:
        time.sleep(4)               # never asks in time: the stall shuts every rank down
    try:
        total()
        error = None
    except hvd.HorovodInternalError as exc:
        error = exc
    waited = time.monotonic() - start
    ok = error is not None and "shut down" in str(error)
    if hvd.rank() != 1:
        ok = ok and "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=1" in str(error) and waited < 3.5
    return check("a stall of 1 s shuts every rank down", ok, (round(waited, 1), error))


def bad_set():
    hvd.init(process_sets=[hvd.ProcessSet([0, 99])])     # never returns: status 2
    return False


MODES = {"uninit": uninit, "split": split, "dynamic": dynamic, "comm-list": comm_list,
         "timeline": timeline, "stall-shutdown": stall_shutdown, "bad-set": bad_set}
passed = MODES[mode]()
sys.exit(0 if passed else 1)
