"""How hpctrain.torch pairs operations across ranks, for every algorithm: by name, in any
order; a name twice in flight; ranks that disagree or pass a bad argument (every rank
raises, none hangs); ``hvd.join`` with uneven numbers of steps; an operation that waits for
its last rank, not for a cycle; the timeline.

Run under mpirun at np = 1..4: ``mpirun -np N python -m pytest --with-mpi
tests/mpi/test_torch_negotiation.py`` (scripts/test bounds each launch in time, so a hang is
a failure). An error test ends with ``hvd.barrier()``: the world must still be usable, and
its final check is collective (``all_ranks``), so a rank that did not raise cannot leave the
others waiting.
"""

import json
import time
from types import SimpleNamespace

import pytest
import torch

import hpctrain.torch as hvd

from conftest import all_ranks, from_rank0, raised

pytestmark = pytest.mark.mpi


def several_ranks(comm, why):
    if comm.size == 1:
        pytest.skip(f"{why}: needs 2 ranks or more")


# ----- names --------------------------------------------------------------------------------

def test_named_operations_pair_whatever_order_ranks_submit_them(torch_algo, comm):
    first, second = comm.rank + 1.0, 10.0 * (comm.rank + 1)

    def submit_a():
        return hvd.allreduce_async(torch.full((4,), first), name="a", op=hvd.Sum)

    def submit_b():
        return hvd.allgather_async(torch.full((1, 2), second), name="b")

    # Rank 0 asks for "a" then "b", the others "b" then "a": neither may wait for the other.
    if comm.rank == 0:
        a, b = submit_a(), submit_b()
    else:
        b, a = submit_b(), submit_a()
    got_b, got_a = hvd.synchronize(b), hvd.synchronize(a)
    want_a = torch.full((4,), float(sum(range(1, comm.size + 1))))
    want_b = torch.tensor([[10.0 * (r + 1)] * 2 for r in range(comm.size)])
    all_ranks(comm, torch.equal(got_a, want_a) and torch.equal(got_b, want_b),
              [got_a.tolist(), got_b.tolist()])


def test_many_names_in_reverse_order_on_odd_ranks(torch_algo, comm):
    names = [f"layer.{i}" for i in range(6)]
    order = names[::-1] if comm.rank % 2 else names
    handles = {n: hvd.allreduce_async(torch.full((3,), float(i + comm.rank)), name=n,
                                      op=hvd.Sum)
               for i, n in sorted(enumerate(names), key=lambda p: order.index(p[1]))}
    bad = []
    for i, n in enumerate(names):
        want = torch.full((3,), float(comm.size * i + sum(range(comm.size))))
        got = hvd.synchronize(handles[n])
        if not torch.equal(got, want):
            bad.append(f"{n}: {got.tolist()} != {want.tolist()}")
    all_ranks(comm, not bad, bad)


def test_a_name_already_in_flight_is_refused_at_once(torch_algo, comm):
    several_ranks(comm, "alone, a rank's operation may finish before it asks again")
    refusals = []
    # A rank that holds back (in an MPI barrier, outside hvd) keeps the others' operation in
    # flight while they ask for its name again; each rank is the one held back once.
    for holder in (comm.size - 1, 0):
        if comm.rank == holder:
            comm.Barrier()
            handle = hvd.allgather_async(torch.ones(1, 2), name=f"twice.{holder}")
        else:
            handle = hvd.allgather_async(torch.ones(1, 2), name=f"twice.{holder}")
            refusals.append(raised(lambda: hvd.allgather_async(torch.ones(1, 2),
                                                               name=f"twice.{holder}")))
            # The same name for another kind of operation is another operation.
            other = hvd.broadcast_async(torch.full((2,), float(comm.rank)), holder,
                                        name=f"twice.{holder}")
            comm.Barrier()
        if comm.rank == holder:
            other = hvd.broadcast_async(torch.full((2,), float(comm.rank)), holder,
                                        name=f"twice.{holder}")
        gathered, bcast = hvd.synchronize(handle), hvd.synchronize(other)
        refusals.append(gathered.shape == (comm.size, 2)
                        and torch.equal(bcast, torch.full((2,), float(holder))))
    # Once done, a name is free again.
    reused = hvd.allgather(torch.ones(1, 2), name="twice.0")
    ok = all(r is True or (isinstance(r, ValueError) and "same name" in str(r))
             for r in refusals) and reused.shape == (comm.size, 2)
    all_ranks(comm, ok and len(refusals) >= 3, [repr(r) for r in refusals])


# ----- ranks that disagree, bad arguments --------------------------------------------------

def disagreeing_call(what, last):
    """A call whose arguments differ on the last rank (``last``) in the way ``what`` says."""
    if what == "allreduce op":
        return lambda: hvd.allreduce(torch.ones(3), name="x", op=hvd.Max if last else hvd.Sum)
    if what == "allgather trailing shape":
        return lambda: hvd.allgather(torch.ones(2, 3 + last), name="x")
    if what == "broadcast root":
        return lambda: hvd.broadcast(torch.ones(2), root_rank=int(last), name="x")
    if what == "reducescatter shape":
        return lambda: hvd.reducescatter(torch.ones(4 + last, 2), name="x")
    if what == "alltoall dtype":
        dtype = torch.float64 if last else torch.float32
        return lambda: hvd.alltoall(torch.ones(hvd.size(), 2, dtype=dtype), name="x")
    raise AssertionError(what)


@pytest.mark.parametrize("what", ["allreduce op", "allgather trailing shape",
                                  "broadcast root", "reducescatter shape", "alltoall dtype"])
def test_ranks_that_disagree_all_raise(torch_algo, comm, what):
    several_ranks(comm, "one rank always agrees with itself")
    error = raised(disagreeing_call(what, comm.rank == comm.size - 1))
    hvd.barrier()
    ok = isinstance(error, hvd.HorovodInternalError) and "different arguments" in str(error)
    all_ranks(comm, ok, [repr(error)])


def test_ranks_that_ask_for_different_names_all_fail_as_a_deadlock(torch_algo, comm):
    several_ranks(comm, "one rank cannot wait for another")
    # Every rank waits for a name no other rank asks for: each would wait for ever. Once all
    # of them have been blocked so for HPCTRAIN_DEADLOCK_S (2 s), all fail together.
    error = raised(lambda: hvd.allreduce(torch.ones(2), name=f"only.{comm.rank}"))
    hvd.barrier()
    others = [r for r in range(comm.size) if r != comm.rank]
    text = str(error)
    ok = (isinstance(error, hvd.HorovodInternalError) and text.startswith("deadlock")
          and f"'allreduce.only.{comm.rank}' asked for by rank(s) {comm.rank}, never by "
              f"rank(s) {', '.join(map(str, others))}" in text)
    all_ranks(comm, ok, [repr(error)])


@pytest.mark.parametrize("bad", ["splits", "type", "scalar"])
def test_a_bad_argument_on_one_rank_raises_there_and_fails_the_others(torch_algo, comm, bad):
    culprit = comm.size - 1 if bad == "type" else 0
    mine = comm.rank == culprit
    if bad == "splits":
        splits = [2] * comm.size
        if mine:
            splits[-1] += 1                 # adds up to more rows than the tensor has
        error = raised(lambda: hvd.alltoall(torch.ones(2 * comm.size, 2), splits=splits,
                                            name="bad"))
        expected = ValueError
    elif bad == "type":
        tensor = [1.0, 2.0] if mine else torch.ones(1, 2)
        error = raised(lambda: hvd.allgather(tensor, name="bad"))
        expected = TypeError
    else:
        tensor = torch.tensor(3.0) if mine else torch.ones(3)
        error = raised(lambda: hvd.reducescatter(tensor))      # unnamed: noname.N
        expected = ValueError
    hvd.barrier()
    # The failed call used up its name (unnamed ones too) on every rank alike: the next
    # unnamed operation still pairs with the same one on the other ranks.
    after = hvd.allreduce(torch.full((2,), comm.rank + 1.0), op=hvd.Sum)
    if mine:
        ok = type(error) is expected
    else:
        ok = (isinstance(error, hvd.HorovodInternalError)
              and f"rank {culprit}: invalid" in str(error))
    ok = ok and torch.equal(after, torch.full((2,), comm.size * (comm.size + 1) / 2))
    all_ranks(comm, ok, [repr(error), after.tolist()])


# ----- operations asked for again and again: the cache ------------------------------------

def count_exchanges(engine):
    """Wrap ``engine``'s negotiation to count, per cycle, the requests this rank sent whole
    and those it announced by their number; return the counts and an undo."""
    from hpctrain.torch.engine import OpAsked

    sent = {"whole": 0, "numbered": 0}
    exchange = engine._exchange

    def counted(mine, bits):
        sent["whole"] += sum(1 for item in mine if isinstance(item, OpAsked))
        sent["numbered"] += len(bits)
        return exchange(mine, bits)

    engine._exchange = counted
    return sent, lambda: engine.__dict__.pop("_exchange")


def test_an_optimizers_buckets_are_announced_by_number_after_their_first_step(torch_algo, comm):
    several_ranks(comm, "over one rank the optimizer reduces nothing")
    from hpctrain.torch.basics import world

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         bucket_mb=256 / 2**20)
    buckets = len(optimizer.buckets)
    sent, undo = count_exchanges(world().engine)
    bad = []
    try:
        for step in range(3):
            optimizer.zero_grad()
            # Each rank's loss is its rank + 1 times a common one: the average gradient is
            # the common gradient times the mean of 1..p, whatever order the sums take.
            x = torch.arange(16.0).reshape(2, 8) / 16
            (model(x).sum() * (comm.rank + 1)).backward()
            optimizer.synchronize()
            with optimizer.skip_synchronize():
                optimizer.step()
            want_bias = torch.full((4,), 2.0 * (comm.size + 1) / 2)
            if not torch.allclose(model[1].bias.grad, want_bias):
                bad.append(f"step {step}: {model[1].bias.grad.tolist()} != {want_bias.tolist()}")
    finally:
        undo()
        optimizer.close()
    # The first step sends every bucket whole; the next two announce them by number.
    counts = (sent["whole"], sent["numbered"])
    everyone = comm.allgather([name for _, name in world().engine.cache.numbered])
    ok = not bad and buckets >= 2 and counts == (buckets, 2 * buckets) and \
        all(names == everyone[0] for names in everyone)
    all_ranks(comm, ok, bad + [buckets, counts, everyone[comm.rank]])


def test_a_numbered_name_asked_with_another_signature_fails_every_rank(torch_algo, comm):
    several_ranks(comm, "one rank always agrees with itself")
    from hpctrain.torch.basics import world
    from hpctrain.torch.ops.allreduce import reduce_flat
    from hpctrain.torch.ops.common import Sum, signature, submit

    w = world()

    def ask(count):
        tensor = torch.ones(count)

        def run(comm_, infos):
            return reduce_flat(comm_, w.algo, tensor, Sum)
        return submit(w, hvd.global_process_set, "repeated", signature(
            "allreduce", [tensor], Sum), f"repeated of {count}", run, repeats=True).wait()

    sums = [ask(4), ask(4)]     # the second is announced by its number
    numbered = (0, "repeated") in w.engine.cache
    # The last rank now asks for one element more, under the same name: not the numbered
    # operation, so it is sent whole and the others' numbers pair with it, then fail.
    error = raised(lambda: ask(5 if comm.rank == comm.size - 1 else 4))
    hvd.barrier()
    ok = numbered and all(torch.equal(t, torch.full((4,), float(comm.size))) for t in sums) \
        and isinstance(error, hvd.HorovodInternalError) and "different arguments" in str(error)
    all_ranks(comm, ok, [numbered, repr(error)])


# ----- join ---------------------------------------------------------------------------------

def test_join_lets_ranks_take_uneven_numbers_of_steps(torch_algo, comm):
    steps = 2 + comm.rank                   # rank r stops after 2 + r steps
    bad = []
    for step in range(steps):
        mine = torch.full((3,), comm.rank + 1.0)
        total = hvd.allreduce(mine, name=f"step.{step}", op=hvd.Sum)
        mean = hvd.allreduce(mine, name=f"mean.{step}")
        # Ranks that have joined count as zeros; the average still divides by every rank.
        active = [r for r in range(comm.size) if 2 + r > step]
        want = float(sum(r + 1 for r in active))
        if not torch.equal(total, torch.full((3,), want)):
            bad.append(f"step {step}: sum {total.tolist()} != {want}")
        if not torch.allclose(mean, torch.full((3,), want / comm.size)):
            bad.append(f"step {step}: average {mean.tolist()} != {want / comm.size}")
    last = hvd.join()
    everyone = comm.allgather(last)
    all_ranks(comm, not bad and everyone == [comm.size - 1] * comm.size, bad + [everyone])


def test_ranks_that_join_together_agree_on_the_last(torch_algo, comm):
    last = hvd.join()
    hvd.barrier()
    everyone = comm.allgather(last)
    all_ranks(comm, len(set(everyone)) == 1 and 0 <= last < comm.size, [everyone])


def test_other_collectives_fail_while_a_rank_has_joined(torch_algo, comm):
    several_ranks(comm, "a rank that has joined and another that has not")
    error = None
    if comm.rank == 0:
        last = hvd.join()
    else:
        error = raised(lambda: hvd.allgather(torch.ones(1, 2), name="after.join"))
        last = hvd.join()
    hvd.barrier()
    everyone = comm.allgather(last)
    ok = (comm.rank == 0 or (isinstance(error, hvd.HorovodInternalError)
                             and "joined" in str(error)))
    ok = ok and len(set(everyone)) == 1 and everyone[0] != 0
    all_ranks(comm, ok, [repr(error), everyone])


# ----- when a negotiation starts -----------------------------------------------------------

def test_an_operation_waits_for_its_last_rank_not_for_a_cycle(comm):
    several_ranks(comm, "one rank never waits for another")
    from hpctrain.torch.engine import Engine, Request
    from hpctrain.torch.ops.common import signature
    from hpctrain.torch.settings import Settings

    # An engine of its own with a 5 s cycle: an operation that waited for a cycle shows it.
    dup = comm.Dup()
    engine = Engine(dup, {0: SimpleNamespace(ranks=list(range(comm.size)), comm=dup)}, {},
                    settings=Settings(cycle_s=5.0))

    def ask(name):
        return engine.submit(Request(0, name, signature("barrier"), name,
                                     lambda c, infos: name))

    try:
        comm.Barrier()
        began = time.monotonic()
        # Rank 0 asks for both at once, so that "b" reaches the table with "a", before the
        # others ask for it: they then owe it (and ask 0.2 s later, which must start a
        # negotiation at once), while rank 0 owes nothing (and must already be waiting in
        # that negotiation, not in its cycle).
        if comm.rank == 0:
            handles = [ask("a"), ask("b")]
        else:
            handles = [ask("a")]
            time.sleep(0.2)
            handles.append(ask("b"))
        got = [handle.wait() for handle in handles]
        took = time.monotonic() - began
    finally:
        engine.close()
        dup.Free()
    all_ranks(comm, got == ["a", "b"] and took < 2.0, [got, f"took {took:.2f} s"])


# ----- timeline -----------------------------------------------------------------------------

def test_the_timeline_records_each_operations_phases(torch_algo, comm, tmp_path):
    path = from_rank0(comm, lambda: str(tmp_path / "timeline.json"))
    hvd.start_timeline(path, mark_cycles=True)
    hvd.allreduce(torch.ones(5), name="traced")
    hvd.allgather(torch.ones(1, 3), name="also.traced")
    hvd.stop_timeline()
    bad = []
    if comm.rank == 0:
        with open(path) as f:
            events = json.load(f)           # valid JSON after stop_timeline
        names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
        pid = next((p for p, n in names.items() if n.endswith("traced")
                    and "also" not in n), None)
        phases = [(e["ph"], e["name"]) for e in events if e.get("pid") == pid]
        for phase in ("NEGOTIATE_ALLREDUCE", "ALLREDUCE"):
            if ("B", phase) not in phases or ("E", phase) not in phases:
                bad.append(f"{phase} not begun and ended under 'traced': {phases}")
        if not any("also.traced" in n for n in names.values()):
            bad.append(f"no process for 'also.traced' in {names}")
        if not any(e.get("name") == "CYCLE_START" for e in events):
            bad.append("mark_cycles=True marked no cycle")
        if sum(e.get("ph") == "B" for e in events) != sum(e.get("ph") == "E" for e in events):
            bad.append("a phase begun and never ended")
    all_ranks(comm, not bad, bad)
