"""Parameter-server allreduce, with point-to-point messages only (no MPI Reduce or Bcast).

- ``ps``: one server (``root=`` option, default 0) receives every other rank's whole
  vector, adds them to its own in rank order and sends the result back to each. Its link
  carries ``2n(p-1)`` bytes while the others carry ``2n``:
  ``2(p-1)α + 2n(p-1)β + n(p-1)γ`` (``α`` overlaps across workers, ``β`` does not). It
  loses to every other algorithm beyond a few ranks; it is here as the classic baseline.
- ``ps-sharded``: ``k`` servers (``servers=`` option, default ``p``; ranks ``0..k-1``) each
  own one of ``k`` shards of the vector, sizes differing by at most one element. Every rank
  sends shard ``i`` to server ``i`` and gets the reduced shard back. Each server carries
  ``2n(p-1)/k`` bytes: with ``k = p`` this is the ring's ``2n(p-1)/p β`` in ``2`` message
  rounds of ``p-1`` concurrent messages, which suits large messages when the network
  handles many concurrent flows well.
"""

from dataclasses import dataclass
from functools import lru_cache

from .algorithm import Algorithm, RootedAlgorithm, chunk_bounds, flat_cost, waitall
from .registry import register
from ..errors import UsageError


@dataclass(frozen=True)
class ServerSchedule:
    """The single server and, on it, the workers in the order their vectors are added."""

    root: int
    workers: tuple
    scratch: int


@dataclass(frozen=True)
class ShardedSchedule:
    """The shards' bounds, which shard this rank serves, and whom it serves."""

    bounds: tuple             # element offsets of the k shards (k + 1 of them)
    servers: int
    clients: tuple            # the other ranks (when this rank is a server)
    scratch: int


@lru_cache(maxsize=256)
def server_schedule(size, rank, count, root):
    """The ``ps`` schedule: ``rank`` is the server or one of its workers."""
    workers = tuple(r for r in range(size) if r != root) if rank == root else ()
    return ServerSchedule(root, workers, 2 * count if len(workers) > 1 else count)


@lru_cache(maxsize=256)
def sharded_schedule(size, rank, count, servers):
    """The ``ps-sharded`` schedule of ``rank`` with ``servers`` servers (ranks 0..k-1)."""
    bounds = chunk_bounds(count, servers)
    if rank >= servers:
        return ShardedSchedule(bounds, servers, (), 0)
    clients = tuple(r for r in range(size) if r != rank)
    return ShardedSchedule(bounds, servers, clients, len(clients) * (bounds[1] - bounds[0]))


@register
class ParameterServer(RootedAlgorithm):
    """One server rank gathers, reduces and returns every vector (point-to-point)."""

    name = "ps"
    tags = 2

    def schedule(self, size, rank, count, itemsize, params, setup=None):
        return server_schedule(size, rank, count, params[0])

    def run(self, comm, flat, plan):
        sched, tag = plan.schedule, self.tag
        if not sched.workers:
            comm.Send(flat, sched.root, tag)
            comm.Recv(flat, sched.root, tag + 1)
            return
        n, reduce = flat.shape[0], plan.reduce
        # Two receive buffers: the next vector arrives while the last one is being added.
        slots = [plan.scratch[:n], plan.scratch[n:2 * n]]
        workers = sched.workers
        pending = [comm.Irecv(slots[i], workers[i], tag) for i in range(min(2, len(workers)))]
        for i in range(len(workers)):
            pending[i].Wait()
            reduce(flat, slots[i % 2])
            if i + 2 < len(workers):
                pending.append(comm.Irecv(slots[i % 2], workers[i + 2], tag))
        waitall([comm.Isend(flat, worker, tag + 1) for worker in workers])

    def cost(self, nbytes, ranks, nodes, params):
        return server_cost(nbytes, ranks, nodes, 1)


@register
class ShardedParameterServer(Algorithm):
    """``servers`` server ranks each reduce and return one shard of the vector."""

    name = "ps-sharded"
    options = {"servers": None}
    tags = 2

    def validate(self, size, params):
        servers = size if params[0] is None else params[0]
        if not 1 <= servers <= size:
            raise UsageError(f"allreduce option servers={servers} is out of range: valid "
                             f"values are 1 to {size} (the number of ranks)")
        return (int(servers),)

    def examples(self, size):
        """Every number of servers."""
        return [{"servers": k} for k in range(1, size + 1)]

    def schedule(self, size, rank, count, itemsize, params, setup=None):
        return sharded_schedule(size, rank, count, params[0])

    def run(self, comm, flat, plan):
        sched, tag, rank = plan.schedule, self.tag, comm.Get_rank()
        bounds = sched.bounds
        shards = [flat[bounds[i]:bounds[i + 1]] for i in range(sched.servers)]
        # Phase 1: every rank's shard i to server i. All sends are non-blocking, so a
        # server is never stuck in a send while its own clients wait for it to receive.
        sends = [comm.Isend(shards[i], i, tag) for i in range(sched.servers) if i != rank]
        if sched.clients:
            mine, reduce = shards[rank], plan.reduce
            width = mine.shape[0]
            slots = [plan.scratch[j * width:(j + 1) * width] for j in range(len(sched.clients))]
            recvs = [comm.Irecv(slot, client, tag) for slot, client in zip(slots, sched.clients)]
            for recv, slot in zip(recvs, slots):   # rank order: the same sum every run
                recv.Wait()
                reduce(mine, slot)
        waitall(sends)
        # Phase 2: the reduced shards back. The regions just sent are free to receive into.
        requests = [comm.Irecv(shards[i], i, tag + 1) for i in range(sched.servers) if i != rank]
        if sched.clients:
            requests += [comm.Isend(shards[rank], client, tag + 1) for client in sched.clients]
        waitall(requests)

    def cost(self, nbytes, ranks, nodes, params):
        return server_cost(nbytes, ranks, nodes, params[0])


def server_cost(nbytes, ranks, nodes, servers):
    """The cost vector of ``servers`` servers. Every link of a server carries its shard
    of every contribution in and of every result out: ``2n(p-1)/k`` bytes. The ``p - 1``
    messages of each round are posted at once, so their time on the wire overlaps, but the
    work of sending and receiving each one, most of α, does not: ``2(p-1)`` messages, an
    upper bound where the wire's latency dominates α."""
    p, k = ranks, min(servers, ranks)
    return flat_cost(2 * (p - 1), 2 * nbytes * (p - 1) / k, nbytes * (p - 1) / k, nodes)
