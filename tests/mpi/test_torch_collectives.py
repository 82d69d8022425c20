"""hpctrain.torch's data collectives other than the plain allreduce, for every algorithm.

Run under mpirun at np = 1..4: ``mpirun -np N python -m pytest --with-mpi
tests/mpi/test_torch_collectives.py``. Covered: allgather (rows that differ per rank, 0
included, any dtype), reduce-scatter (rows that do not divide by the ranks, Sum/Average,
integer truncation, scale factors), alltoall (equal, given and received splits), broadcast,
the grouped forms, each collective's gradient (Horovod's conventions), Product, Adasum, sparse
allreduce and ``hvd.SyncBatchNorm``. ``tests/mpi/test_torch_matches_horovod.py`` covers the
allreduce itself and the optimizer.

Every rank's input is a function of its rank, so each rank computes the expected result from
all ranks' inputs itself; the values are small integers, exact in any order of summation and
in every dtype. Each algorithm's tests run between one ``init`` and one ``shutdown``.
"""

import math

import pytest
import torch
from torch import nn

import hpctrain.torch as hvd

from conftest import all_ranks, raised

pytestmark = pytest.mark.mpi


def pattern(rank, rows, width=3, dtype=torch.float32):
    """Rank ``rank``'s ``(rows, width)`` input: small integers, different on every rank."""
    cells = torch.arange(rows * width, dtype=torch.int64).view(rows, width)
    return ((cells + 5 * rank) % 9 - 4).to(dtype)


def cast(values, dtype):
    """``values`` in ``dtype``; bool and uint8 get a range they can hold."""
    if dtype == torch.bool:
        return values % 2 == 1
    if dtype == torch.uint8:
        return (values % 7 + 7).to(dtype)
    return values.to(dtype)


def gathered_rows(rank):
    """Rows of rank ``rank`` in the allgather tests: 0 on rank 0 and on rank 3."""
    return [0, 2, 5, 0][rank % 4] + rank // 4


def own_rows(whole, rows, rank):
    """Rank ``rank``'s rows of ``whole``, which holds ``rows[r]`` rows of each rank r."""
    start = sum(rows[:rank])
    return whole[start:start + rows[rank]]


def row_blocks(rows, size):
    """Rows of each rank after a reduce-scatter: as even as they go, the first ranks one more
    (Horovod's split)."""
    base, extra = divmod(rows, size)
    return [base + (r < extra) for r in range(size)]


# ----- allgather ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16, torch.uint8,
                                   torch.bool])
def test_allgather_concatenates_rows_that_differ_per_rank(torch_algo, comm, dtype):
    mine = cast(pattern(comm.rank, gathered_rows(comm.rank)), dtype)
    got = hvd.allgather(mine, name=f"gather.{dtype}")
    want = torch.cat([cast(pattern(r, gathered_rows(r)), dtype) for r in range(comm.size)])
    all_ranks(comm, got.dtype == dtype and torch.equal(got, want),
              [f"{dtype}: {got.tolist()} != {want.tolist()}"])


def test_allgather_keeps_the_trailing_dimensions(torch_algo, comm):
    mine = pattern(comm.rank, 2 * (comm.rank + 1) * 4, width=3).view(-1, 4, 3)
    got = hvd.synchronize(hvd.allgather_async(mine))
    want = torch.cat([pattern(r, 2 * (r + 1) * 4, width=3).view(-1, 4, 3)
                      for r in range(comm.size)])
    all_ranks(comm, got.shape == want.shape and torch.equal(got, want), [got.shape])


def test_grouped_allgather_gathers_each_tensor(torch_algo, comm):
    first = pattern(comm.rank, comm.rank % 3, dtype=torch.float64)
    second = cast(pattern(comm.rank, gathered_rows(comm.rank), width=1), torch.bool)
    got = hvd.grouped_allgather([first, second])
    via_handle = hvd.synchronize(hvd.grouped_allgather_async([first, second], name="pair"))
    want = [torch.cat([pattern(r, r % 3, dtype=torch.float64) for r in range(comm.size)]),
            torch.cat([cast(pattern(r, gathered_rows(r), width=1), torch.bool)
                       for r in range(comm.size)])]
    ok = all(torch.equal(a, b) for a, b in zip(got + via_handle, want + want))
    all_ranks(comm, ok and len(got) == len(via_handle) == 2)


def test_allgather_gradient_is_the_rank_average_of_this_ranks_rows(torch_algo, comm):
    rows = [gathered_rows(r) + 1 for r in range(comm.size)]
    x = pattern(comm.rank, rows[comm.rank]).requires_grad_()
    gathered = hvd.allgather(x)
    # Each rank weighs the gathered rows differently: the gradient averages the weights.
    weight = (comm.rank + 1) * pattern(7, sum(rows))
    (gathered * weight).sum().backward()
    mean = sum((r + 1) * pattern(7, sum(rows)) for r in range(comm.size)) / comm.size
    want = own_rows(mean, rows, comm.rank)
    all_ranks(comm, torch.allclose(x.grad, want), [f"{x.grad.tolist()} != {want.tolist()}"])


# ----- reduce-scatter -----------------------------------------------------------------------

@pytest.mark.parametrize("rows", [7, 1, 0, 12])
@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_reducescatter_cuts_rows_as_evenly_as_they_go(torch_algo, comm, rows, op):
    mine = pattern(comm.rank, rows)
    got = hvd.reducescatter(mine, op=getattr(hvd, op), name=f"rs.{rows}.{op}")
    total = sum(pattern(r, rows, dtype=torch.float64) for r in range(comm.size))
    if op == "Average":
        total = total / comm.size
    want = own_rows(total, row_blocks(rows, comm.size), comm.rank).float()
    all_ranks(comm, got.shape == want.shape and torch.allclose(got, want),
              [f"{op} of {rows} rows: {got.tolist()} != {want.tolist()}"])


def test_reducescatter_integer_average_truncates_towards_zero(torch_algo, comm):
    rows = 2 * comm.size + 1
    mine = pattern(comm.rank, rows, dtype=torch.int32)
    got = hvd.reducescatter(mine)
    total = sum(pattern(r, rows, dtype=torch.int64) for r in range(comm.size))
    mine_total = own_rows(total, row_blocks(rows, comm.size), comm.rank)
    want = torch.div(mine_total, comm.size, rounding_mode="trunc").int()
    all_ranks(comm, got.dtype == torch.int32 and torch.equal(got, want),
              [f"{got.tolist()} != {want.tolist()} (sums {mine_total.tolist()})"])


def test_reducescatter_scale_factors_multiply_the_result(torch_algo, comm):
    rows = comm.size + 2
    got = hvd.reducescatter(pattern(comm.rank, rows), op=hvd.Sum, prescale_factor=2.0,
                            postscale_factor=0.25)
    total = sum(pattern(r, rows) for r in range(comm.size)) * 0.5
    want = own_rows(total, row_blocks(rows, comm.size), comm.rank)
    all_ranks(comm, torch.equal(got, want), [f"{got.tolist()} != {want.tolist()}"])


def test_grouped_reducescatter_scatters_each_tensor(torch_algo, comm):
    tensors = [pattern(comm.rank, 5), pattern(comm.rank, 3, width=2, dtype=torch.float64)]
    got = hvd.grouped_reducescatter(tensors, op=hvd.Sum)
    via_handle = hvd.synchronize(hvd.grouped_reducescatter_async(tensors, op=hvd.Sum))
    bad = []
    for out, again, rows, width, dtype in zip(got, via_handle, (5, 3), (3, 2),
                                              (torch.float32, torch.float64)):
        total = sum(pattern(r, rows, width, dtype) for r in range(comm.size))
        want = own_rows(total, row_blocks(rows, comm.size), comm.rank)
        if not (torch.equal(out, want) and torch.equal(again, want)):
            bad.append(f"{out.tolist()} / {again.tolist()} != {want.tolist()}")
    all_ranks(comm, not bad, bad)


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_reducescatter_gradient_is_the_allgather_of_the_gradients(torch_algo, comm, op):
    rows = 2 * comm.size + 1
    x = pattern(comm.rank, rows).requires_grad_()
    block = hvd.reducescatter(x, op=getattr(hvd, op))
    (block * (comm.rank + 1)).sum().backward()
    # Horovod's convention: the gathered output gradients, times the ranks for Sum.
    blocks = row_blocks(rows, comm.size)
    factor = comm.size if op == "Sum" else 1
    want = torch.cat([torch.full((blocks[r], 3), float((r + 1) * factor))
                      for r in range(comm.size)])
    all_ranks(comm, torch.equal(x.grad, want), [f"{x.grad.tolist()} != {want.tolist()}"])


# ----- alltoall -----------------------------------------------------------------------------

def sent_rows(source, dest):
    """Rows rank ``source`` sends rank ``dest`` when splits are given: some are 0."""
    return (source + 2 * dest) % 3


def labelled(source, splits, width=2):
    """Rank ``source``'s alltoall input: row j of the block for ``dest`` holds
    ``100 * source + 10 * dest + j`` (width copies)."""
    rows = [torch.full((width,), 100.0 * source + 10 * dest + j)
            for dest, count in enumerate(splits) for j in range(count)]
    return torch.stack(rows) if rows else torch.empty(0, width)


def test_alltoall_with_equal_splits(torch_algo, comm):
    per = 2
    mine = labelled(comm.rank, [per] * comm.size)
    got = hvd.alltoall(mine)
    want = torch.cat([labelled(s, [per] * comm.size)[comm.rank * per:(comm.rank + 1) * per]
                      for s in range(comm.size)])
    all_ranks(comm, torch.equal(got, want), [f"{got.tolist()} != {want.tolist()}"])


@pytest.mark.parametrize("as_tensor", [False, True])
def test_alltoall_with_given_splits_returns_the_received_splits(torch_algo, comm, as_tensor):
    splits = [sent_rows(comm.rank, d) for d in range(comm.size)]
    mine = labelled(comm.rank, splits)
    given = torch.tensor(splits, dtype=torch.int32) if as_tensor else splits
    got, received = hvd.alltoall(mine, splits=given, name=f"a2a.{as_tensor}")
    want_received = [sent_rows(s, comm.rank) for s in range(comm.size)]
    want = [torch.full((2,), 100.0 * s + 10 * comm.rank + j)
            for s in range(comm.size) for j in range(sent_rows(s, comm.rank))]
    want = torch.stack(want) if want else torch.empty(0, 2)
    ok = torch.equal(got, want) and received.tolist() == want_received
    all_ranks(comm, ok, [f"{got.tolist()} {received.tolist()}"])


def test_alltoall_gradient_goes_back_to_the_sender(torch_algo, comm):
    splits = [sent_rows(comm.rank, d) + 1 for d in range(comm.size)]
    x = torch.zeros(sum(splits), 2, requires_grad=True)
    got, received = hvd.alltoall(x, splits=splits)
    # The gradient of each received row names the receiver, its sender and its index.
    upstream = torch.cat([torch.full((count, 2), 1000.0 * comm.rank + 10 * s) +
                          torch.arange(count, dtype=torch.float32).view(-1, 1)
                          for s, count in enumerate(received.tolist())])
    (got * upstream).sum().backward()
    want = torch.cat([torch.full((count, 2), 1000.0 * d + 10 * comm.rank) +
                      torch.arange(count, dtype=torch.float32).view(-1, 1)
                      for d, count in enumerate(splits)])
    all_ranks(comm, torch.equal(x.grad, want), [f"{x.grad.tolist()} != {want.tolist()}"])


# ----- broadcast ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.float64])
def test_broadcast_async_from_every_root_new_and_in_place(torch_algo, comm, dtype):
    bad = []
    for root in range(comm.size):
        mine = cast(pattern(comm.rank, 3, width=4), dtype)
        root_values = cast(pattern(root, 3, width=4), dtype)
        new = hvd.synchronize(hvd.broadcast_async(mine, root, name=f"new.{root}"))
        if not torch.equal(new, root_values) or not torch.equal(
                mine, cast(pattern(comm.rank, 3, width=4), dtype)):
            bad.append(f"new tensor from root {root}")
        same = hvd.broadcast_(mine, root)
        if same is not mine or not torch.equal(mine, root_values):
            bad.append(f"in place from root {root}")
    all_ranks(comm, not bad, bad)


def test_broadcast_gradient_is_the_average_on_the_root_and_zero_elsewhere(torch_algo, comm):
    bad = []
    for root in range(comm.size):
        x = pattern(comm.rank, 2).requires_grad_()
        (hvd.broadcast(x, root) * (comm.rank + 1)).sum().backward()
        mean = sum(r + 1 for r in range(comm.size)) / comm.size
        want = torch.full((2, 3), mean if comm.rank == root else 0.0)
        if not torch.allclose(x.grad, want):
            bad.append(f"root {root}: {x.grad.tolist()} != {want.tolist()}")
    all_ranks(comm, not bad, bad)


# ----- allreduce: grouped gradient, Product, Adasum, sparse ---------------------------------

def test_grouped_allreduce_gradient_reduces_each_gradient(torch_algo, comm):
    a = torch.ones(3, requires_grad=True)
    b = torch.ones(2, 2, dtype=torch.float64, requires_grad=True)
    out = hvd.grouped_allreduce([a * (comm.rank + 1), b * 2], op=hvd.Average)
    (out[0].sum() * (comm.rank + 1) + out[1].sum() * comm.rank).backward()
    # d/da: the average over ranks of (r + 1), times this rank's own factor (r + 1).
    mean_a = sum(r + 1 for r in range(comm.size)) / comm.size
    mean_b = sum(range(comm.size)) / comm.size
    ok = (torch.allclose(a.grad, torch.full((3,), mean_a * (comm.rank + 1)))
          and torch.allclose(b.grad, torch.full((2, 2), 2 * mean_b, dtype=torch.float64)))
    all_ranks(comm, ok, [a.grad.tolist(), b.grad.tolist()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.float16, torch.uint8])
def test_product_multiplies_every_ranks_values(torch_algo, comm, dtype):
    def factors(rank):
        values = (torch.arange(11) + rank) % 4 - 1        # -1, 0, 1, 2
        return (values + 1 if dtype == torch.uint8 else values).to(dtype)

    got = hvd.allreduce(factors(comm.rank), op=hvd.Product, name=f"prod.{dtype}")
    want = math.prod(factors(r).to(torch.int64) for r in range(comm.size))
    all_ranks(comm, got.dtype == dtype and torch.equal(got.to(torch.int64), want),
              [f"{got.tolist()} != {want.tolist()}"])


def adasum_pair(a, b):
    """Horovod's Adasum of two vectors (float64)."""
    dot = torch.dot(a, b)
    left = 1 - dot / (2 * torch.dot(a, a)) if torch.dot(a, a) > 0 else 1.0
    right = 1 - dot / (2 * torch.dot(b, b)) if torch.dot(b, b) > 0 else 1.0
    return left * a + right * b


def adasum_of(vectors):
    """Adasum of a power-of-two list: neighbours first, then pairs of pairs."""
    while len(vectors) > 1:
        vectors = [adasum_pair(a, b) for a, b in zip(vectors[::2], vectors[1::2])]
    return vectors[0]


def adasum_input(rank):
    return torch.tensor([1.0, 0.0, rank, 2.0 - rank, 1.0, 3.0], dtype=torch.float64)


def test_adasum_combines_as_horovod_on_a_power_of_two(torch_algo, comm):
    if comm.size & (comm.size - 1):
        pytest.skip("Adasum needs a power of two of ranks (the error is tested below)")
    got = hvd.allreduce(adasum_input(comm.rank), op=hvd.Adasum)
    want = adasum_of([adasum_input(r) for r in range(comm.size)])
    # Orthogonal inputs add up, identical ones give themselves.
    unit = torch.zeros(4, dtype=torch.float32)
    unit[comm.rank] = comm.rank + 1.0
    orthogonal = hvd.allreduce(unit, op=hvd.Adasum)
    same = hvd.allreduce(torch.tensor([3.0, -1.0]), op=hvd.Adasum)
    summed = torch.zeros(4)
    summed[:comm.size] = torch.arange(1.0, comm.size + 1)
    ok = (torch.allclose(got, want, rtol=1e-12) and torch.equal(orthogonal, summed)
          and torch.equal(same, torch.tensor([3.0, -1.0])))
    all_ranks(comm, ok, [f"{got.tolist()} vs {want.tolist()}; {orthogonal.tolist()}"])


def test_adasum_refuses_a_number_of_ranks_that_is_no_power_of_two(torch_algo, comm):
    if not comm.size & (comm.size - 1):
        pytest.skip(f"{comm.size} ranks are a power of two: Adasum runs (tested above)")
    error = raised(lambda: hvd.allreduce(torch.ones(4), op=hvd.Adasum))
    hvd.barrier()   # the world is still usable
    all_ranks(comm, error is not None and "power of two" in str(error), [repr(error)])


def sparse_input(rank):
    """Rank ``rank``'s sparse (5, 2) matrix: two entries, one where another rank has one."""
    where = torch.tensor([[rank % 3, 4], [0, 1]])
    return torch.sparse_coo_tensor(where, torch.tensor([rank + 1.0, -rank]), (5, 2),
                                   check_invariants=True)


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_sparse_allreduce_adds_every_ranks_entries(torch_algo, comm, op):
    handle = hvd.sparse_allreduce_async(sparse_input(comm.rank), f"sparse.{op}",
                                        getattr(hvd, op))
    got = hvd.synchronize(handle)
    want = sum(sparse_input(r).to_dense() for r in range(comm.size))
    if op == "Average":
        want = want / comm.size
    ok = got.is_sparse and torch.allclose(got.to_dense(), want)
    all_ranks(comm, ok, [f"{got} != {want.tolist()}"])


# ----- hvd.SyncBatchNorm --------------------------------------------------------------------

def norm_batch(rank):
    """Rank ``rank``'s batch of 2 channels: 1 to 4 rows, so the ranks' batches differ."""
    rows = [3, 1, 4, 2][rank % 4]
    return pattern(rank, rows, width=2, dtype=torch.float64)


def test_sync_batch_norm_normalises_the_union_of_uneven_batches(torch_algo, comm):
    layer = hvd.SyncBatchNorm(2, dtype=torch.float64)
    x = norm_batch(comm.rank).requires_grad_()
    out = layer(x)
    (out * pattern(comm.rank + 3, x.shape[0], width=2, dtype=torch.float64)).sum().backward()
    reference = nn.BatchNorm1d(2, dtype=torch.float64)
    batches = [norm_batch(r).requires_grad_() for r in range(comm.size)]
    whole = reference(torch.cat(batches))
    upstream = torch.cat([pattern(r + 3, b.shape[0], width=2, dtype=torch.float64)
                          for r, b in enumerate(batches)])
    (whole * upstream).sum().backward()
    mine = own_rows(whole, [b.shape[0] for b in batches], comm.rank)
    ok = (torch.allclose(out, mine) and torch.allclose(x.grad, batches[comm.rank].grad)
          and torch.allclose(layer.running_mean, reference.running_mean)
          and torch.allclose(layer.running_var, reference.running_var))
    all_ranks(comm, ok, [f"{out.tolist()} vs {mine.tolist()}"])
