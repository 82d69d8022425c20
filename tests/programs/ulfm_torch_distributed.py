"""A rank of a ``torch.distributed`` job on the ``hpctrain`` backend SIGKILLs itself while
the others wait on it; on a fault-tolerant MPI every survivor's pending work must fail.

    mpirun --with-ft ulfm -np N python tests/programs/ulfm_torch_distributed.py [VICTIM]

Needs the fault-tolerant stack (``scripts/setup --ft``). Before the victim dies, every
survivor has pending: an asynchronous ``all_reduce`` (its work and its future), DDP's
gradient buckets in a backward pass, and on the lowest survivor a receive from the victim
and one from the highest survivor, which never sends. Each survivor prints, per pending
thing, when it failed and with what (``rank R: WHAT failed at t=T: TYPE: MESSAGE``), then
what a later collective does, then destroys the group and exits 0; the victim prints when
it dies. tests/test_torch_distributed_launch.py runs it.
"""

import os
import signal
import sys
import time

# As tests/programs/ulfm_shrink.py: MPI_Finalize's fence over the whole job can wait for
# ever after a death.
os.environ.setdefault("OMPI_MCA_async_mpi_finalize", "1")

import torch  # noqa: E402 - after the setting above, read by MPI_Init
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import hpctrain.torch.distributed  # noqa: E402,F401 - registers the backend

#: Seconds the victim waits before it dies, so that everything below is pending by then.
DIES_AFTER = 1.0


def report(rank, what, call):
    try:
        call()
    except Exception as error:  # noqa: BLE001 - what it was is the point
        first = str(error).strip().splitlines()[0]
        print(f"rank {rank}: {what} failed at t={time.time():.3f}: {type(error).__name__}: "
              f"{first}", flush=True)
        return
    print(f"rank {rank}: {what} completed, but the victim is dead", flush=True)


def main():
    dist.init_process_group("hpctrain")
    rank, size = dist.get_rank(), dist.get_world_size()
    victim = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    survivors = [r for r in range(size) if r != victim]
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
    dist.barrier()
    if rank == victim:
        time.sleep(DIES_AFTER)
        print(f"rank {rank}: SIGKILL at t={time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    pending = {"all_reduce": dist.all_reduce(torch.ones(4), async_op=True)}
    future = dist.all_reduce(torch.ones(4), async_op=True).get_future()
    if rank == survivors[0]:
        pending["recv from the victim"] = dist.irecv(torch.empty(3), src=victim)
        pending["recv from a survivor"] = dist.irecv(torch.empty(3), src=survivors[-1])
    report(rank, "DDP backward", lambda: model(torch.ones(8, 4)).sum().backward())
    report(rank, "future", future.wait)
    for what, work in pending.items():
        report(rank, what, work.wait)
    report(rank, "later all_reduce", lambda: dist.all_reduce(torch.ones(1)))
    dist.destroy_process_group()
    print(f"rank {rank}: ended", flush=True)


if __name__ == "__main__":
    main()
