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
import os
import socket

import torch

from .basics import world
from ..errors import UsageError
from .ops.allreduce import reduce_flat
from .ops.common import Average, object_call, resolve_op, signature, submit
from .process_sets import global_process_set


def init_process_group(backend="gloo", timeout_s=300):
    """Set up ``torch.distributed``'s default process group over the ranks of ``init``.

    Synchronisation point: :func:`rendezvous` over the communicator of ``init`` (an
    allgather of host names, a broadcast of rank 0's store address), so no
    ``MASTER_ADDR``/``MASTER_PORT`` is needed.
    """
    import torch.distributed as dist

    w = world()
    timeout = datetime.timedelta(seconds=timeout_s)
    store = rendezvous(w.data_comm, timeout,
                       lambda call, what: object_call(f"rendezvous {what}", None, None,
                                                      lambda comm: call()))
    dist.init_process_group(backend, store=store, rank=w.rank, world_size=w.size,
                            timeout=timeout)


def rendezvous(comm, timeout, collective=None):
    """Collective over ``comm``: a ``TCPStore`` served by rank 0 and joined by every rank.

    Synchronisation points: an allgather of host names, then a broadcast of the store's
    address and port from rank 0. Ranks that all share one host meet on 127.0.0.1; otherwise
    at rank 0's address (of ``GLOO_SOCKET_IFNAME`` if set, else its first non-loopback
    interface). Each rank then points gloo at its own interface that routes to that address
    (``GLOO_SOCKET_IFNAME``, unless the user set it): gloo would otherwise bind to whatever
    the host name resolves to, often loopback, which other hosts cannot reach.
    ``collective(call, what)`` runs each MPI call (default: here, at once); the library runs
    them on its communication thread, the only one that may use ``comm``.
    """
    import torch.distributed as dist

    collective = collective or (lambda call, what: call())
    rank = comm.Get_rank()
    hosts = collective(lambda: comm.allgather(socket.gethostname()), "hosts")
    store, where = None, None
    if rank == 0:
        address = "127.0.0.1" if len(set(hosts)) == 1 else _own_address()
        # Port 0: the system picks a free port; the workers learn it from the broadcast.
        store = dist.TCPStore(address, 0, comm.Get_size(), True, timeout,
                              wait_for_workers=False)
        where = (address, store.port)
    address, port = collective(lambda: comm.bcast(where, root=0), "store address")
    if rank != 0:
        store = dist.TCPStore(address, port, comm.Get_size(), False, timeout)
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = _interface_reaching(address)
    return store


def _own_address():
    chosen = os.environ.get("GLOO_SOCKET_IFNAME")
    addresses = interface_addresses()
    if chosen:
        if chosen not in addresses:
            raise UsageError(f"GLOO_SOCKET_IFNAME={chosen} has no IPv4 address here; "
                             f"interfaces: {addresses}")
        return addresses[chosen]
    public = [a for a in addresses.values() if not a.startswith("127.")]
    if not public:
        raise UsageError(f"no non-loopback IPv4 interface to meet the other hosts on: "
                         f"{addresses}")
    return public[0]


def _interface_reaching(address):
    # Connecting a UDP socket sends nothing: it only asks the kernel which source address
    # (and so which interface) it would route packets to ``address`` from.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, 9))
        source = probe.getsockname()[0]
    names = [name for name, mine in interface_addresses().items() if mine == source]
    if not names:
        raise UsageError(f"no interface holds {source}, the address that routes to {address}")
    return names[0]


def interface_addresses():
    """``{interface name: IPv4 address}`` of this host's interfaces that have one (the first,
    where one has several), from ``psutil.net_if_addrs()``; ``UsageError`` without psutil."""
    try:
        import psutil
    except ImportError:
        raise UsageError("hpctrain.torch.init_process_group finds this host's network "
                         "interfaces with psutil, which is not installed here: "
                         "pip install psutil") from None
    found = {}
    for name, addresses in psutil.net_if_addrs().items():
        ipv4 = [a.address for a in addresses if a.family == socket.AF_INET]
        if ipv4:
            found[name] = ipv4[0]
    return found


def comm_hook(op=Average):
    """A DDP communication hook: ``model.register_comm_hook(None, comm_hook())``.

    Each bucket is reduced with the algorithm chosen at ``init`` (``op``: ``Average``, as
    DDP's default hook, or ``Sum``). Buckets are reduced in the order DDP hands them over,
    which DDP keeps the same on every rank. The returned :class:`CommHook` counts what it
    reduced (``buckets``, ``elements``).
    """
    return CommHook(world(), resolve_op(None, op))


class CommHook:
    """The hook :func:`comm_hook` returns; DDP calls it once per bucket while backward runs.

    ``buckets`` and ``elements`` count the buckets and gradient values it has reduced so far:
    a script (or a test) can tell from them that its gradients went through hpctrain and not
    through DDP's own allreduce, which gives the same replicas. They are updated on the
    communication thread before a bucket's future completes, so they are up to date once
    ``backward()`` has returned (DDP waits for every bucket's future).
    """

    def __init__(self, w, op):
        self.world, self.op = w, op
        self.buckets = self.elements = 0
        # register_comm_hook names the hook in DDP's logs by these, which a function has.
        self.__name__ = self.__qualname__ = "comm_hook"

    def __call__(self, state, bucket):
        tensor = bucket.buffer()
        future = torch.futures.Future()
        event = None
        if tensor.is_cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(tensor.device))

        def run(comm, infos):
            try:
                if event is not None:
                    torch.cuda.current_stream(tensor.device).wait_event(event)
                reduce_flat(comm, self.world.algo, tensor, self.op)
                if tensor.is_cuda:
                    torch.cuda.current_stream(tensor.device).synchronize()
                self.buckets += 1
                self.elements += tensor.numel()
                future.set_result(tensor)
            except BaseException as exc:  # noqa: B036 - handed to DDP through the future
                future.set_exception(exc)

            return None

        w = self.world
        name = w.next_name(0, "ddp.bucket")
        submit(w, global_process_set, name, signature("allreduce", [tensor], self.op),
               f"DDP bucket {name} of {tensor.numel()} elements", run)
        return future
