"""hpctrain.torch's process sets, for every algorithm: sets given to ``init`` and added or
removed later, collectives on two disjoint sets at once, a barrier of one set that does not
wait for the other, ranks outside a set, roots given as world ranks, and a
``DistributedOptimizer`` per set.

Run under mpirun at np = 1..4: ``mpirun -np N python -m pytest --with-mpi
tests/mpi/test_torch_process_sets.py``. Each algorithm's ``init`` registers two static sets,
the even and the odd world ranks (none at np = 1: the only set of one rank there is the
global set, which cannot be added twice); the tests that need two disjoint sets skip at
np = 1 and say so.
"""

import time

import pytest
import torch
from torch import nn

import hpctrain.torch as hvd

from conftest import TORCH_ALGOS, all_ranks, raised

pytestmark = pytest.mark.mpi


@pytest.fixture(params=TORCH_ALGOS, scope="module")
def sets(request, comm):
    """``{"evens": ProcessSet, "odds": ProcessSet}`` registered by this algorithm's init."""
    ranks = {"evens": list(range(0, comm.size, 2)), "odds": list(range(1, comm.size, 2))}
    static = {name: hvd.ProcessSet(r) for name, r in ranks.items()} if comm.size > 1 else {}
    hvd.init(allreduce=request.param, process_sets=list(static.values()))
    yield static
    hvd.shutdown()


def two_sets(sets):
    """This rank's static set and the other one (skips at np = 1)."""
    if not sets:
        pytest.skip("two disjoint sets need 2 ranks or more")
    mine = "evens" if hvd.rank() % 2 == 0 else "odds"
    other = "odds" if mine == "evens" else "evens"
    return sets[mine], sets[other]


def test_sets_from_init_reduce_among_their_own_ranks(sets, comm):
    mine, other = two_sets(sets)
    got = hvd.allreduce(torch.full((3,), comm.rank + 1.0), op=hvd.Sum, process_set=mine)
    want = torch.full((3,), float(sum(r + 1 for r in mine.ranks)))
    ok = (torch.equal(got, want) and mine.included() and not other.included()
          and mine.rank() == mine.ranks.index(comm.rank) and other.rank() is None
          and mine.size() + other.size() == comm.size)
    all_ranks(comm, ok, [got.tolist(), repr(mine)])


def test_disjoint_sets_run_different_collectives_at_once(sets, comm):
    mine, _ = two_sets(sets)
    evens = mine.ranks[0] == 0
    # One name, two sets, two kinds: the sets pair their operations among themselves.
    if evens:
        handle = hvd.allgather_async(torch.full((1, 2), comm.rank + 0.0), name="both",
                                     process_set=mine)
    else:
        handle = hvd.broadcast_async(torch.full((2,), comm.rank + 0.0), mine.ranks[-1],
                                     name="both", process_set=mine)
    world = hvd.allreduce_async(torch.ones(2), name="both", op=hvd.Sum)
    # Unnamed operations are numbered per set: the evens make two, the odds one, and the
    # global one that follows still pairs across both.
    for _ in range(2 if evens else 1):
        hvd.allreduce(torch.ones(1), process_set=mine)
    unnamed = hvd.allreduce(torch.ones(1), op=hvd.Sum)
    got = hvd.synchronize(handle)
    if evens:
        want = torch.tensor([[float(r)] * 2 for r in mine.ranks])
    else:
        want = torch.full((2,), float(mine.ranks[-1]))
    ok = (torch.equal(got, want) and torch.equal(hvd.synchronize(world),
                                                 torch.full((2,), float(comm.size)))
          and unnamed.item() == comm.size)
    all_ranks(comm, ok, [got.tolist()])


def test_a_barrier_of_one_set_does_not_wait_for_the_other(sets, comm):
    mine, _ = two_sets(sets)
    tag, patience = 917, 30.0
    arrived = True
    if comm.rank == 0:
        # Rank 0 (an even) makes no hvd call until rank 1 (an odd) has passed the odds'
        # barrier: were that barrier to wait for the evens, rank 0 would give up here.
        request = comm.irecv(source=1, tag=tag)
        deadline = time.monotonic() + patience
        arrived = False
        while not arrived and time.monotonic() < deadline:
            arrived, _ = request.test()
            time.sleep(0.01)
        if not arrived:
            request.Cancel()
    hvd.barrier(process_set=mine)
    if comm.rank == 1:
        comm.send("past the odds' barrier", dest=0, tag=tag)
    hvd.barrier()
    all_ranks(comm, arrived, [f"rank 1 did not pass the odds' barrier in {patience} s"])


def test_a_rank_outside_a_set_gets_value_error_at_once(sets, comm):
    _, other = two_sets(sets)
    calls = {
        "allreduce": lambda: hvd.allreduce(torch.ones(2), process_set=other),
        "allgather": lambda: hvd.allgather(torch.ones(1, 2), process_set=other),
        "broadcast": lambda: hvd.broadcast(torch.ones(2), other.ranks[0], process_set=other),
        "reducescatter": lambda: hvd.reducescatter(torch.ones(4), process_set=other),
        "alltoall": lambda: hvd.alltoall(torch.ones(other.size()), process_set=other),
        "barrier": lambda: hvd.barrier(process_set=other),
    }
    errors = {kind: raised(call) for kind, call in calls.items()}
    hvd.barrier()
    bad = [f"{kind}: {error!r}" for kind, error in errors.items()
           if not (isinstance(error, ValueError) and "is not in" in str(error))]
    all_ranks(comm, not bad, bad)


def test_a_root_is_a_world_rank_of_the_set(sets, comm):
    mine, other = two_sets(sets)
    root = mine.ranks[-1]
    got = hvd.broadcast(torch.full((2,), comm.rank + 0.0), root, process_set=mine)
    # A rank of the other set is no root for this one: every member raises.
    error = raised(lambda: hvd.broadcast(torch.ones(2), other.ranks[0], process_set=mine))
    hvd.barrier()
    ok = (torch.equal(got, torch.full((2,), float(root))) and isinstance(error, ValueError)
          and "root_rank" in str(error))
    all_ranks(comm, ok, [got.tolist(), repr(error)])


def test_sets_are_removed_added_and_added_again(sets, comm):
    two_sets(sets)
    odds = sets["odds"]
    removed = hvd.remove_process_set(odds)      # every rank removes it
    gone = raised(lambda: hvd.allreduce(torch.ones(2), process_set=odds))
    # Ranks 1.. (the odds themselves at np = 2, where every other subset is taken).
    tail = hvd.add_process_set(list(range(1, comm.size)))
    member = comm.rank != 0
    if member:
        got = hvd.allreduce(torch.full((2,), float(comm.rank)), op=hvd.Sum, process_set=tail)
        used = torch.equal(got, torch.full((2,), float(sum(range(1, comm.size)))))
    else:
        outside = raised(lambda: hvd.allreduce(torch.ones(2), process_set=tail))
        used = isinstance(outside, ValueError) and tail.included() is False
    ids = comm.allgather(tail.process_set_id)
    ok = (removed is True and isinstance(gone, ValueError) and "not registered" in str(gone)
          and used and len(set(ids)) == 1 and hvd.remove_process_set(tail) is True
          and hvd.remove_process_set(tail) is False
          and hvd.remove_process_set(hvd.global_process_set) is False)
    again = hvd.add_process_set(odds)
    if odds.included():
        back = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=odds)
        ok = ok and again is odds and back.item() == odds.size()
    hvd.barrier()
    all_ranks(comm, ok, [repr(gone), ids])


def test_a_set_of_the_same_ranks_as_another_is_refused_on_every_rank(sets, comm):
    error = raised(lambda: hvd.add_process_set(list(range(comm.size))))
    out_of_range = raised(lambda: hvd.add_process_set([0, comm.size]))
    hvd.barrier()
    ok = (isinstance(error, ValueError) and "exists already" in str(error)
          and isinstance(out_of_range, ValueError))
    all_ranks(comm, ok, [repr(error), repr(out_of_range)])


# ----- DistributedOptimizer per set ----------------------------------------------------------

def network():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))


def batch(rank, step):
    """Rank ``rank``'s batch at ``step``: its own data, so the two sets learn differently."""
    gen = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(5, 4, generator=gen), torch.randn(5, 2, generator=gen)


def loss_of(net, rank, step):
    x, y = batch(rank, step)
    return nn.functional.mse_loss(net(x), y)


def test_distributed_optimizer_trains_each_set_on_its_own(sets, comm):
    mine, _ = two_sets(sets)
    steps, lr = 3, 0.1
    net = network()
    hvd.broadcast_parameters(net.state_dict(), root_rank=mine.ranks[0], process_set=mine)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=lr),
                                   named_parameters=net.named_parameters(), process_set=mine)
    for step in range(steps):
        opt.zero_grad()
        loss_of(net, comm.rank, step).backward()
        opt.step()
    # The same training on one process: the gradient averaged over this set's ranks only.
    reference = network()
    for step in range(steps):
        grads = [torch.autograd.grad(loss_of(reference, r, step), reference.parameters())
                 for r in mine.ranks]
        with torch.no_grad():
            for i, p in enumerate(reference.parameters()):
                p -= lr * sum(g[i] for g in grads) / len(grads)
    weights = torch.cat([p.detach().view(-1) for p in net.parameters()])
    want = torch.cat([p.detach().view(-1) for p in reference.parameters()])
    everyone = comm.allgather(weights)
    others = [everyone[r] for r in range(comm.size) if r not in mine.ranks]
    ok = (torch.allclose(weights, want, atol=1e-6)
          and all(torch.equal(everyone[r], weights) for r in mine.ranks)
          and not any(torch.allclose(o, weights) for o in others))
    all_ranks(comm, ok, [f"{(weights - want).abs().max().item():g}"])
