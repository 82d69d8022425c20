"""The two lines of a ``torch.distributed`` script on the ``hpctrain`` backend, and what they
do with bad input; rank 0 prints what happened.

    mpirun -np 2 python tests/programs/torch_distributed.py CASE

``import``: importing registers the backend and starts nothing (no MPI, no thread);
``sum``: ``init_process_group("hpctrain")`` with no address, rank or store, then a SUM of
rank + 1 (exit 1 on a wrong sum); ``skip-new-group``: every rank but 0 calls ``new_group``,
rank 0 goes on to an all_reduce; ``gloo``: ``init_process_group("gloo")`` without
``MASTER_ADDR`` after the import (only the hpctrain backend runs without a store);
``serialized``: mpi4py told to start MPI at ``MPI_THREAD_SERIALIZED``, then
``init_process_group("hpctrain")``; ``timeout``: a group whose ``timeout`` is 2 s, and an
all_reduce that rank 0 makes alone and the others only once rank 0's has failed: every rank
prints what its call raised, then the sum pairs as before.
"""

import datetime
import sys
import threading

import mpi4py
import torch
import torch.distributed as dist

import hpctrain.torch.distributed  # noqa: F401 - registers the backend

case = sys.argv[1]
if case == "serialized":
    mpi4py.rc.thread_level = "serialized"
if case == "import":
    print(f"hpctrain registered: {'HPCTRAIN' in dist.Backend._plugins}; MPI imported: "
          f"{'mpi4py.MPI' in sys.modules}; threads: {threading.active_count()}", flush=True)
    sys.exit(0)
dist.init_process_group("gloo" if case == "gloo" else "hpctrain",
                        timeout=datetime.timedelta(seconds=2 if case == "timeout" else 600))
rank, size = dist.get_rank(), dist.get_world_size()
if case == "skip-new-group" and rank != 0:
    dist.new_group(list(range(size)))
if case == "timeout":
    from mpi4py import MPI

    if rank:
        MPI.COMM_WORLD.Barrier()        # rank 0's all_reduce has failed
    try:
        dist.all_reduce(torch.ones(1))
        print(f"rank {rank}: the all_reduce completed", flush=True)
    except RuntimeError as error:
        print(f"rank {rank}: {type(error).__name__}: {str(error).splitlines()[0]}", flush=True)
    if not rank:
        MPI.COMM_WORLD.Barrier()
total = torch.full((3,), float(rank + 1))
dist.all_reduce(total)
if rank == 0:
    print(f"{dist.get_backend()} over {size} ranks: {total.tolist()}", flush=True)
dist.destroy_process_group()
sys.exit(0 if bool((total == size * (size + 1) / 2).all()) else 1)
