"""PyTorch ``DistributedDataParallel`` with hpctrain's allreduce, through a comm hook.

    import hpctrain.torch as hvd
    hvd.init()                                  # the algorithm: init(allreduce=...) or env
    hvd.init_process_group()                    # DDP's process group, from the MPI world
    model = DistributedDataParallel(model)
    model.register_comm_hook(None, hvd.comm_hook())

DDP still builds its buckets and calls the hook once per bucket while backward runs; the
hook queues the bucket's flat tensor on hpctrain's communication thread and returns a
future that the thread completes with the averaged values. DDP's own process group (gloo)
is used only for what DDP does besides gradients: the initial broadcast of the weights.
"""

import datetime
import socket

import torch

from .basics import world
from .ops import Average, reduce_flat, resolve_op


def init_process_group(backend="gloo", timeout_s=300):
    """Set up ``torch.distributed``'s default process group over the ranks of ``init``.

    Synchronisation point: an allgather of host names and a broadcast of rank 0's store
    address. Rank 0 serves a ``TCPStore`` on a port the system picks (on 127.0.0.1 when
    every rank runs on its host, else on the address its host name resolves to), so no
    ``MASTER_ADDR``/``MASTER_PORT`` is needed.
    """
    import torch.distributed as dist

    from .ops import run_on_thread

    w = world()
    timeout = datetime.timedelta(seconds=timeout_s)
    hosts = run_on_thread(w, lambda: w.comm.allgather(socket.gethostname()), "hosts")
    store, where = None, None
    if w.rank == 0:
        address = ("127.0.0.1" if len(set(hosts)) == 1
                   else socket.gethostbyname(socket.gethostname()))
        store = dist.TCPStore(address, 0, w.size, True, timeout, wait_for_workers=False)
        where = (address, store.port)
    address, port = run_on_thread(w, lambda: w.comm.bcast(where, root=0), "store address")
    if w.rank != 0:
        store = dist.TCPStore(address, port, w.size, False, timeout)
    dist.init_process_group(backend, store=store, rank=w.rank, world_size=w.size,
                            timeout=timeout)


def comm_hook(op=Average):
    """A DDP communication hook: ``model.register_comm_hook(None, comm_hook())``.

    Each bucket is reduced with the algorithm chosen at ``init`` (``op``: ``Average``, as
    DDP's default hook, or ``Sum``). Buckets are reduced in the order DDP hands them over,
    which DDP keeps the same on every rank.
    """
    op = resolve_op(None, op)
    w = world()

    def hook(state, bucket):
        tensor = bucket.buffer()
        future = torch.futures.Future()
        event = None
        if tensor.is_cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(tensor.device))

        def run():
            try:
                if event is not None:
                    torch.cuda.current_stream(tensor.device).wait_event(event)
                reduce_flat(w, tensor, op)
                if tensor.is_cuda:
                    torch.cuda.current_stream(tensor.device).synchronize()
                future.set_result(tensor)
            except BaseException as exc:  # noqa: B036 - handed to DDP through the future
                future.set_exception(exc)

        w.engine.submit(run)
        return future

    return hook
