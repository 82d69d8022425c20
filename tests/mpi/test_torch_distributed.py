"""The ``hpctrain`` backend of ``torch.distributed``: every c10d collective, for every
allreduce algorithm.

Run under mpirun at np = 1..4: ``mpirun -np N python -m pytest --with-mpi
tests/mpi/test_torch_distributed.py``. The process group is made as a user's script makes it,
``dist.init_process_group("hpctrain")`` with no address, rank or store, once per algorithm
(``HPCTRAIN_ALLREDUCE``), and destroyed after its tests.

Every rank's input is a function of its rank, so each rank computes the expected result from
all ranks' inputs itself; the values are small integers, exact in every dtype and any order of
summation (averages are taken of multiples of the number of ranks). Every check is collective
(``all_ranks``), so that a rank failing alone never leaves the others waiting.
"""

import datetime
import inspect
import time

import pytest
import torch
import torch.distributed as dist

import hpctrain.torch.distributed  # noqa: F401 - registers the backend

from conftest import TORCH_ALGOS, all_ranks, from_rank0, raised

pytestmark = pytest.mark.mpi

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
          torch.int64, torch.uint8, torch.int8, torch.int16, torch.bool]
FLOATS = [d for d in DTYPES if d.is_floating_point]
OPS = ["SUM", "AVG", "MIN", "MAX", "PRODUCT", "PREMUL_SUM", "BAND", "BOR", "BXOR"]
#: Element counts: empty, one, a prime that divides by no number of ranks.
COUNTS = [0, 1, 7]
#: Seconds of the short timeouts (of groups, of one call) in the timeout test.
TIMEOUT_S = 1.0
#: Whether this torch hands PREMUL_SUM's factor to a Python group (2.13 does, 2.10 not):
#: without it the op is refused (test_premul_sum_without_its_factor_is_refused).
PREMUL_FACTOR = hasattr(dist._make_nccl_premul_sum(2.0), "factor")


def values(rank, count, dtype, scale=1):
    """Rank ``rank``'s ``count`` small integers, as ``dtype`` can hold them."""
    cells = (torch.arange(count, dtype=torch.int64) * 3 + 5 * rank) % 9 - 4
    if dtype == torch.bool:
        cells = cells % 2
    elif dtype == torch.uint8:
        cells = cells % 7 + 7
    return (cells * scale).to(dtype)


def folded(name, inputs, dtype):
    """The reduction ``name`` of ``inputs`` (one per rank), computed here."""
    wide = [t.to(torch.float64 if dtype.is_floating_point else torch.int64) for t in inputs]
    total = wide[0].clone()
    for t in wide[1:]:
        if name in ("SUM", "AVG", "PREMUL_SUM"):
            total += t
        elif name == "PRODUCT":
            total *= t
        elif name == "MIN":
            total = torch.minimum(total, t)
        elif name == "MAX":
            total = torch.maximum(total, t)
        else:
            fold = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
                    "BXOR": torch.bitwise_xor}[name]
            total = fold(total, t)
    if name == "AVG":
        total = torch.div(total, len(inputs), rounding_mode="trunc")
    if name == "PREMUL_SUM":
        total = total * 2
    return total.to(dtype)


def op_of(name):
    if name == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(2.0)
    return getattr(dist.ReduceOp, name)


def takes(name, dtype):
    """Whether c10d's op ``name`` applies to ``dtype`` (bitwise: integers and bool; AVG and
    PREMUL_SUM: floating point, as gloo and NCCL take them)."""
    if name in ("BAND", "BOR", "BXOR"):
        return not dtype.is_floating_point
    if name == "PREMUL_SUM" and not PREMUL_FACTOR:
        return False
    if name in ("AVG", "PREMUL_SUM"):
        return dtype.is_floating_point
    return True


def compare(failures, what, got, want):
    if not torch.equal(got, want):
        failures.append(f"{what}: got {got.tolist()}, want {want.tolist()}")


def test_all_reduce_every_op_and_dtype(dist_algo, comm):
    rank, size = dist.get_rank(), dist.get_world_size()
    failures = []
    for dtype in DTYPES:
        for name in OPS:
            if not takes(name, dtype):
                continue
            scale = size if name == "AVG" else 1
            for count in COUNTS:
                tensor = values(rank, count, dtype, scale)
                dist.all_reduce(tensor, op=op_of(name))
                want = folded(name, [values(r, count, dtype, scale) for r in range(size)],
                              dtype)
                compare(failures, f"{dist_algo} {name} {dtype} n={count}", tensor, want)
    all_ranks(comm, not failures, failures)


def test_all_reduce_non_contiguous_and_async(dist_algo, comm):
    rank, size = dist.get_rank(), dist.get_world_size()
    base = values(rank, 12, torch.float32).view(3, 4)
    column = base.t()                              # not contiguous
    work = dist.all_reduce(column, async_op=True)
    future = work.get_future()
    work.wait()
    want = folded("SUM", [values(r, 12, torch.float32).view(3, 4).t() for r in range(size)],
                  torch.float32)
    failures = []
    compare(failures, "non-contiguous", column, want)
    compare(failures, "future value", future.value()[0], want)
    all_ranks(comm, work.is_completed() and future.done() and not failures, failures)


def sparse_of(rank, dense_width=0):
    """Rank ``rank``'s sparse COO tensor of shape (6,) or (6, dense_width): a non-zero at
    row ``rank % 6`` and one at row 5 that every rank shares, given twice (uncoalesced)."""
    rows = [rank % 6, 5, 5]
    shape = (6, dense_width) if dense_width else (6,)
    vals = torch.tensor([rank + 1.0, 1.0, 2.0])
    if dense_width:
        vals = vals[:, None].expand(3, dense_width).clone()
    return torch.sparse_coo_tensor([rows], vals, shape)


def test_sparse_all_reduce_sums_in_place_and_refuses_other_ops(dist_algo, comm):
    rank, size = dist.get_rank(), dist.get_world_size()
    failures = []
    for width in (0, 3):                        # plain, and hybrid (a dense part per row)
        tensor = sparse_of(rank, width)
        dist.all_reduce(tensor)
        want = sum(sparse_of(r, width).to_dense() for r in range(size))
        if not tensor.is_sparse or not tensor.is_coalesced():
            failures.append(f"width {width}: the result is not a coalesced sparse tensor")
        compare(failures, f"sparse width {width}", tensor.to_dense(), want)
    refused = raised(lambda: dist.all_reduce(sparse_of(rank), op=dist.ReduceOp.MAX))
    if not isinstance(refused, RuntimeError) or "ReduceOp.SUM only" not in str(refused):
        failures.append(f"MAX of a sparse tensor: {refused!r}")
    all_ranks(comm, not failures, failures)


def test_all_reduce_coalesced(dist_algo, comm):
    rank, size = dist.get_rank(), dist.get_world_size()
    tensors = [values(rank, n, dtype) for n, dtype in
               [(3, torch.float32), (5, torch.int64), (0, torch.float32), (2, torch.bfloat16)]]
    with dist._coalescing_manager(async_ops=True) as manager:
        for t in tensors:
            dist.all_reduce(t)
    manager.wait()
    failures = []
    for t in tensors:
        want = folded("SUM", [values(r, t.numel(), t.dtype) for r in range(size)], t.dtype)
        compare(failures, f"coalesced {t.dtype}", t, want)
    all_ranks(comm, not failures, failures)


def test_broadcast_and_reduce_every_root(dist_algo, comm):
    rank, size = dist.get_rank(), dist.get_world_size()
    failures = []
    for root in range(size):
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.bool):
            tensor = values(rank, 7, dtype)
            dist.broadcast(tensor, src=root)
            compare(failures, f"broadcast {dtype} root {root}", tensor, values(root, 7, dtype))
            for name in ("SUM", "MAX", "PRODUCT"):
                tensor = values(rank, 7, dtype)
                dist.reduce(tensor, dst=root, op=op_of(name))
                if rank == root:
                    want = folded(name, [values(r, 7, dtype) for r in range(size)], dtype)
                    compare(failures, f"reduce {name} {dtype} root {root}", tensor, want)
    all_ranks(comm, not failures, failures)


def test_all_gather_forms(dist_algo, comm):
    rank, size = dist.get_rank(), dist.get_world_size()
    failures = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.bool):
        for count in COUNTS:
            mine = values(rank, count, dtype)
            outputs = [torch.empty(count, dtype=dtype) for _ in range(size)]
            dist.all_gather(outputs, mine)
            for r, out in enumerate(outputs):
                compare(failures, f"all_gather {dtype} n={count} from {r}", out,
                        values(r, count, dtype))
            whole = torch.empty(size * count, dtype=dtype)
            dist.all_gather_into_tensor(whole, mine)
            want = torch.cat([values(r, count, dtype) for r in range(size)])
            compare(failures, f"all_gather_into_tensor {dtype} n={count}", whole, want)
    # all_gather_coalesced: output_lists[r][i] is rank r's i-th tensor.
    mine = [values(rank, 3, torch.float32), values(rank, 2, torch.float32)]
    outputs = [[torch.empty_like(t) for t in mine] for _ in range(size)]
    dist.all_gather_coalesced(outputs, mine)
    for r in range(size):
        for i, t in enumerate(mine):
            compare(failures, f"all_gather_coalesced rank {r} tensor {i}", outputs[r][i],
                    values(r, t.numel(), t.dtype))
    all_ranks(comm, not failures, failures)


def test_reduce_scatter_forms(dist_algo, comm):
    rank, size = dist.get_rank(), dist.get_world_size()
    failures = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.uint8):
        for name in ("SUM", "AVG", "MAX", "PREMUL_SUM", "BOR"):
            if not takes(name, dtype):
                continue
            scale = size if name == "AVG" else 1
            for count in COUNTS:
                whole = [values(r, count * size, dtype, scale) for r in range(size)]
                want = folded(name, whole, dtype)[rank * count:(rank + 1) * count]
                out = torch.empty(count, dtype=dtype)
                dist.reduce_scatter_tensor(out, whole[rank].clone(), op=op_of(name))
                compare(failures, f"reduce_scatter_tensor {name} {dtype} n={count}", out,
                        want)
                out = torch.empty(count, dtype=dtype)
                dist.reduce_scatter(out, list(whole[rank].clone().view(size, count).unbind()),
                                    op=op_of(name))
                compare(failures, f"reduce_scatter {name} {dtype} n={count}", out, want)
    all_ranks(comm, not failures, failures)


def test_all_to_all_uneven(dist_algo, comm):
    rank, size = dist.get_rank(), dist.get_world_size()
    # Rank i sends (i + j) % 3 rows of width 2 to rank j: some blocks are empty.
    rows = [[(i + j) % 3 for j in range(size)] for i in range(size)]

    def block(i, j, dtype):
        return (torch.arange(rows[i][j] * 2) + 10 * i + j).view(-1, 2).to(dtype)

    failures = []
    for dtype in (torch.bfloat16, torch.float32, torch.int64):
        send = torch.cat([block(rank, j, dtype) for j in range(size)])
        recv_rows = [rows[i][rank] for i in range(size)]
        out = torch.empty(sum(recv_rows), 2, dtype=dtype)
        dist.all_to_all_single(out, send, output_split_sizes=recv_rows,
                               input_split_sizes=rows[rank])
        want = torch.cat([block(i, rank, dtype) for i in range(size)])
        compare(failures, f"all_to_all_single {dtype}", out, want)
        outs = [torch.empty(rows[i][rank], 2, dtype=dtype) for i in range(size)]
        dist.all_to_all(outs, [block(rank, j, dtype) for j in range(size)])
        compare(failures, f"all_to_all {dtype}", torch.cat(outs), want)
    even = torch.arange(size * 3, dtype=torch.float32) + 100 * rank
    out = torch.empty_like(even)
    dist.all_to_all_single(out, even)
    want = torch.cat([torch.arange(rank * 3, rank * 3 + 3, dtype=torch.float32) + 100 * i
                      for i in range(size)])
    compare(failures, "all_to_all_single equal", out, want)
    all_ranks(comm, not failures, failures)


def test_gather_scatter_every_root(dist_algo, comm):
    rank, size = dist.get_rank(), dist.get_world_size()
    failures = []
    for root in range(size):
        mine = values(rank, 5, torch.bfloat16)
        outs = [torch.empty(5, dtype=torch.bfloat16) for _ in range(size)] \
            if rank == root else None
        dist.gather(mine, outs, dst=root)
        if rank == root:
            for r, out in enumerate(outs):
                compare(failures, f"gather root {root} from {r}", out,
                        values(r, 5, torch.bfloat16))
        out = torch.empty(4, dtype=torch.int64)
        pieces = [values(r + 10 * root, 4, torch.int64) for r in range(size)] \
            if rank == root else None
        dist.scatter(out, pieces, src=root)
        compare(failures, f"scatter root {root}", out, values(rank + 10 * root, 4, torch.int64))
    all_ranks(comm, not failures, failures)


def test_barrier_and_object_collectives(dist_algo, comm):
    rank, size = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    gathered = [None] * size
    dist.all_gather_object(gathered, {"rank": rank})
    objects = [f"from {rank}"]
    dist.broadcast_object_list(objects, src=size - 1)
    ok = gathered == [{"rank": r} for r in range(size)] and objects == [f"from {size - 1}"]
    all_ranks(comm, ok, [f"{gathered} {objects}"])


def test_send_recv(dist_algo, comm):
    rank, size = dist.get_rank(), dist.get_world_size()
    failures = []
    if size > 1:
        right, left = (rank + 1) % size, (rank - 1) % size
        got = torch.empty(6, dtype=torch.bfloat16)
        ops = [dist.P2POp(dist.isend, values(rank, 6, torch.bfloat16), right),
               dist.P2POp(dist.irecv, got, left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        compare(failures, "batch_isend_irecv", got, values(left, 6, torch.bfloat16))
        # Every rank but 0 sends to rank 0, which receives from whichever comes first.
        if rank == 0:
            senders = []
            for _ in range(size - 1):
                got = torch.empty(3, dtype=torch.int64)
                sender = dist.recv(got, tag=7)
                senders.append(sender)
                compare(failures, f"recv from any ({sender})", got,
                        values(sender, 3, torch.int64))
            if sorted(senders) != list(range(1, size)):
                failures.append(f"senders {senders}")
        else:
            dist.send(values(rank, 3, torch.int64), dst=0, tag=7)
        column = torch.zeros(4, 3).t()          # a non-contiguous receive
        if rank == 0:
            dist.send(torch.arange(12.0).view(3, 4), dst=size - 1)
        elif rank == size - 1:
            dist.recv(column, src=0)
            compare(failures, "non-contiguous recv", column, torch.arange(12.0).view(3, 4))
    all_ranks(comm, not failures, failures)


def test_new_group_and_device_mesh(dist_algo, comm):
    from torch.distributed.device_mesh import init_device_mesh

    rank, size = dist.get_rank(), dist.get_world_size()
    failures = []
    odd = dist.new_group([r for r in range(size) if r % 2])
    again = dist.new_group(list(range(size)))     # the world's ranks: a group of its own
    if rank % 2:
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=odd)
        compare(failures, "odd group", t, torch.tensor([float(sum(range(1, size, 2)))]))
    t = torch.tensor([1])
    dist.all_reduce(t, group=again)
    compare(failures, "second world group", t, torch.tensor([size]))
    if size % 2 == 0:
        mesh = init_device_mesh("cpu", (size // 2, 2), mesh_dim_names=("replicate", "shard"))
        for dim in ("replicate", "shard"):
            group = mesh.get_group(dim)
            ranks = dist.get_process_group_ranks(group)
            t = torch.tensor([rank])
            dist.all_reduce(t, group=group)
            compare(failures, f"mesh {dim}", t, torch.tensor([sum(ranks)]))
    all_ranks(comm, not failures, failures)


def test_sub_groups_of_a_sub_group_and_groups_that_overlap(dist_algo, comm):
    rank, size = dist.get_rank(), dist.get_world_size()
    failures = []
    # Halves of 3 ranks would make 2 and 1 sub-groups, and every rank of the world makes as
    # many new_group calls (docs/torch-distributed.md): sub-groups of halves at other sizes.
    if size != 3:
        failures += sub_groups_of_halves(rank, size)
    if size > 2:      # rank r asks for {r, r+1}: each group's next member asked for another
        error = raised(lambda: dist.new_group([rank, (rank + 1) % size]))
        if not isinstance(error, ValueError) or "asked for" not in str(error):
            failures.append(f"overlapping groups: {error!r}")
    # Only a group's members calling: refused on each of them at once, nothing waits.
    error = raised(lambda: dist.new_group([rank], use_local_synchronization=True))
    if not isinstance(error, ValueError) or "use_local_synchronization" not in str(error):
        failures.append(f"use_local_synchronization: {error!r}")
    t = torch.ones(1)
    dist.all_reduce(t)                      # the world still works afterwards
    compare(failures, "world after", t, torch.tensor([float(size)]))
    all_ranks(comm, not failures, failures)


def sub_groups_of_halves(rank, size):
    """new_subgroups(group=) of each half of the world (even and odd ranks): torch calls
    new_group on each half's ranks with that half's groups, so ranks ask for different
    groups in one call. The failures seen."""
    failures = []
    halves = [list(range(first, size, 2)) for first in range(min(size, 2))]
    half, half_groups = dist.new_subgroups_by_enumeration(ranks_per_subgroup_list=halves)
    mine, singles = dist.new_subgroups(group_size=1, group=half)
    if len(singles) != len(halves[rank % 2]) or dist.get_process_group_ranks(mine) != [rank]:
        failures.append(f"{len(singles)} groups, mine {dist.get_process_group_ranks(mine)}")
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t, group=mine)
    compare(failures, "a group of one", t, torch.tensor([rank + 1.0]))
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t, group=half)
    compare(failures, "half", t, torch.tensor([sum(r + 1.0 for r in halves[rank % 2])]))
    for group in singles + half_groups:
        dist.destroy_process_group(group)
    return failures


def test_errors_raise_on_every_rank(dist_algo, comm):
    rank, size = dist.get_rank(), dist.get_world_size()
    errors = []
    if size > 1:
        # Shapes that differ across ranks: every rank raises, as gloo does (RuntimeError).
        errors.append(raised(lambda: dist.all_reduce(torch.ones(2 + (rank == 0)))))
    # An op the dtype cannot take: TypeError everywhere, before anything is sent.
    errors.append(raised(lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)))
    # A root that is not a rank of the group.
    errors.append(raised(lambda: dist.broadcast(torch.ones(2), src=size)))
    ok = all(isinstance(e, (RuntimeError, TypeError, ValueError)) for e in errors)
    t = torch.ones(1)
    dist.all_reduce(t)                  # the group still works afterwards
    all_ranks(comm, ok and t.item() == size, [repr(e) for e in errors])


def test_premul_sum_without_its_factor_is_refused(dist_algo, comm):
    """Where torch does not give a Python group PREMUL_SUM's factor, the op raises on every
    rank, naming the torch that does, before anything is sent; the group works after."""
    if PREMUL_FACTOR:
        pytest.skip(f"torch {torch.__version__} gives the factor: the op is tested above")
    errors = [raised(lambda: dist.all_reduce(torch.ones(2), op=op_of("PREMUL_SUM"))),
              raised(lambda: dist.reduce_scatter_tensor(
                  torch.empty(1), torch.ones(dist.get_world_size()), op=op_of("PREMUL_SUM")))]
    ok = all(isinstance(e, NotImplementedError) and "torch 2.13" in str(e) for e in errors)
    t = torch.ones(1)
    dist.all_reduce(t)
    all_ranks(comm, ok and t.item() == dist.get_world_size(), [repr(e) for e in errors])


def late_call(comm, call):
    """``call()`` on rank 0 at once and on the others once rank 0's has ended; per rank,
    ``(error, seconds)``: what it raised (``None``: nothing) and how long it took."""
    if comm.rank:
        comm.Barrier()
    start = time.monotonic()
    error = raised(call)
    took = time.monotonic() - start
    if not comm.rank:
        comm.Barrier()
    return error, took


@pytest.fixture
def timed_groups(dist_algo):
    """``(short, slow)``: two groups of every rank, of a ``TIMEOUT_S`` and of a 120 s timeout,
    for the timeout tests, which run for the first algorithm only (timeouts are the engine's
    and MPI's, whatever the algorithm) and need a peer; destroyed after the test."""
    if dist_algo != TORCH_ALGOS[0]:
        pytest.skip("timeouts do not depend on the algorithm: one suffices")
    size = dist.get_world_size()
    if size == 1:
        pytest.skip("one rank never waits for another")
    short = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=TIMEOUT_S))
    slow = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=120))
    yield short, slow
    for made in (short, slow):
        dist.destroy_process_group(made)


def ddp_on(group, comm, tries=3):
    """A DDP model over ``group`` (of a short timeout), its set-up tried up to ``tries`` times
    by every rank together."""
    for attempt in range(1, tries + 1):
        comm.Barrier()
        try:
            return torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1),
                                                             process_group=group)
        except RuntimeError as error:
            if " Timed out " not in str(error) or attempt == tries:
                raise


def test_a_collective_past_its_timeout_fails_on_every_rank(timed_groups, comm):
    """Only rank 0 calls, the others only after its call failed: rank 0's fails once the
    timeout has passed, theirs at once, with the same error (gloo's type, RuntimeError),
    whether waited for by ``wait()``, by the future or by DDP's reducer, and the group's next
    collective pairs as before."""
    rank, size = dist.get_rank(), dist.get_world_size()
    failures = []
    group, slow = timed_groups
    # DDP's reducer waits on the future in C++: it must see a failed future as failed. Its
    # set-up makes collectives on the group of the short timeout: the ranks start it
    # together, and start again where a rank was late by more than the timeout all the same
    # (seen at load averages of 10 and 18); such a time-out fails on every rank alike.
    model = ddp_on(group, comm)
    cases = {
        "barrier": lambda: dist.barrier(group=group),
        "DDP's backward": lambda: model(torch.ones(3, 2)).sum().backward(),
        "the call's timeout": lambda: dist.barrier(
            group=slow, timeout=datetime.timedelta(seconds=TIMEOUT_S)),
        "a future": lambda: dist.all_reduce(torch.ones(3), group=group,
                                            async_op=True).get_future().wait(),
    }
    if "timeout" not in inspect.signature(dist.barrier).parameters:
        del cases["the call's timeout"]         # missing in 2.5.1, 2.7.1 and 2.10.0
    for what, call in cases.items():
        error, took = late_call(comm, call)
        if not isinstance(error, RuntimeError) or " Timed out " not in str(error):
            failures.append(f"{what}: raised {error!r}")
        if rank == 0 and not TIMEOUT_S <= took < TIMEOUT_S + 5:
            failures.append(f"{what}: rank 0 waited {took:.2f} s, timeout {TIMEOUT_S} s")
        if rank and took > 5:
            failures.append(f"{what}: a late rank waited {took:.2f} s")
        comm.Barrier()              # together again, well within the timeout
        t = torch.tensor([rank + 1])
        dist.all_reduce(t, group=group)
        compare(failures, f"after {what}", t, torch.tensor([size * (size + 1) // 2]))
    all_ranks(comm, not failures, failures)



def timed(call):
    """``(error, seconds)`` of ``call()``: what it raised (``None``: nothing), how long."""
    start = time.monotonic()
    error = raised(call)
    return error, time.monotonic() - start


def test_send_and_recv_past_their_timeout_fail_and_wait_takes_a_timeout(timed_groups, comm):
    """On rank 0: a receive that no message matches within its group's timeout is cancelled
    and raises (gloo's type and words), and the message sent after it goes to the next
    receive; a send too large to leave without a receive raises too, while MPI keeps it (a
    receive posted later gets its data); ``Work.wait(timeout)`` raises once its own limit
    has passed and the receive goes on: a later ``wait()`` gets the message."""
    rank = dist.get_rank()
    failures = []
    group, slow = timed_groups

    def expect_timeout(what, call, limit):
        error, took = timed(call)
        if not isinstance(error, RuntimeError) or " Timed out " not in str(error):
            failures.append(f"{what}: raised {error!r}")
        if not limit <= took < limit + 5:
            failures.append(f"{what}: waited {took:.2f} s, timeout {limit} s")

    if rank == 0:
        expect_timeout("recv", lambda: dist.recv(torch.empty(3), src=1, group=group, tag=11),
                       TIMEOUT_S)
    comm.Barrier()
    if rank == 1:
        dist.send(torch.full((3,), 5.0), dst=0, group=group, tag=11)
    elif rank == 0:
        got = torch.empty(3)
        dist.recv(got, src=1, group=group, tag=11)
        compare(failures, "the recv after a cancelled one", got, torch.full((3,), 5.0))

    count = 1 << 21                     # 8 MiB: past every transport's eager limit
    if rank == 0:
        expect_timeout("send", lambda: dist.send(torch.full((count,), 3.0), dst=1,
                                                 group=group, tag=12), TIMEOUT_S)
    comm.Barrier()
    if rank == 1:
        got = torch.empty(count)
        dist.recv(got, src=0, group=group, tag=12)
        if not bool((got == 3.0).all()):
            failures.append("the abandoned send's data did not arrive whole")

    if rank == 0:
        got = torch.empty(2)
        work = dist.irecv(got, src=1, group=slow, tag=13)
        expect_timeout("Work.wait(timeout)",
                       lambda: work.wait(timeout=datetime.timedelta(seconds=TIMEOUT_S)),
                       TIMEOUT_S)
    comm.Barrier()
    if rank == 1:
        dist.send(torch.tensor([1.0, 2.0]), dst=0, group=slow, tag=13)
    elif rank == 0:
        work.wait()
        compare(failures, "the irecv after its wait timed out", got, torch.tensor([1.0, 2.0]))
    comm.Barrier()
    all_ranks(comm, not failures, failures)

def test_new_group_asked_for_another_backend_says_what_it_made(dist_algo, comm):
    if dist_algo != TORCH_ALGOS[0]:
        pytest.skip("group making is the backend's, whatever the algorithm: one suffices")
    with pytest.warns(UserWarning, match=r"backend='gloo'\) made an 'hpctrain' group"):
        group = dist.new_group(backend="gloo")
    t = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(t, group=group)         # it works, over hpctrain
    size = dist.get_world_size()
    dist.destroy_process_group(group)
    all_ranks(comm, int(t) == size * (size + 1) // 2, [f"sum {int(t)}"])


def test_functional_collectives(dist_algo, comm):
    import torch.distributed._functional_collectives as functional

    rank, size = dist.get_rank(), dist.get_world_size()
    world = dist.group.WORLD
    failures = []
    compare(failures, "all_reduce",
            functional.all_reduce(torch.full((3,), float(rank + 1)), "sum", world),
            torch.full((3,), size * (size + 1) / 2))
    compare(failures, "all_gather_tensor",
            functional.all_gather_tensor(torch.full((2,), float(rank)), 0, world),
            torch.arange(size, dtype=torch.float32).repeat_interleave(2))
    compare(failures, "reduce_scatter_tensor",
            functional.reduce_scatter_tensor(torch.arange(2.0 * size), "sum", 0, world),
            torch.arange(2.0 * rank, 2.0 * rank + 2) * size)
    all_ranks(comm, not failures, failures)


def test_checkpoint_of_a_sharded_model(dist_algo, comm, tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from hpctrain.torch.distributed.versions import fully_shard


    where = from_rank0(comm, lambda: str(tmp_path))

    def sharded(seed):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 3))
        fully_shard(net)
        return net

    saved = sharded(0)
    dcp.save({"model": saved.state_dict()}, checkpoint_id=where)
    loaded = sharded(1)
    state = {"model": loaded.state_dict()}
    dcp.load(state, checkpoint_id=where)
    loaded.load_state_dict(state["model"])
    same = all(torch.equal(a.full_tensor(), b.full_tensor())
               for a, b in zip(saved.parameters(), loaded.parameters()))
    all_ranks(comm, same)
