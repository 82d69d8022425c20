"""Run under mpirun: ``mpirun -np N python -m pytest --with-mpi tests/mpi/test_sync_batch_norm.py``
for N = 1 to 4.

Each rank holds its own batch, of a size that differs between ranks (0 rows on one rank at
np >= 3). Every rank gathers all batches (mpi4py) and runs one ``torch.nn.BatchNorm*d`` on
their concatenation: :class:`SyncBatchNorm`'s output and input gradient must be that
reference's rows for this rank, the sum over ranks of its weight and bias gradients the
reference's, and its running statistics the reference's, in float64 to 1e-10. Every final
assertion is collective (``all_ranks``).
"""

from functools import partial

import pytest
import torch
from mpi4py import MPI

import hpctrain.torch as hvd
from conftest import all_ranks
from hpctrain.torch.sync_batch_norm import SyncBatchNorm, horovod_sum

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
SIZE, RANK = COMM.Get_size(), COMM.Get_rank()
CHANNELS = 3
#: Rows per rank: uneven, and 0 on rank 2.
ROWS = [5, 2, 0, 3][:SIZE]
REFERENCES = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d,
              5: torch.nn.BatchNorm3d}
SPATIAL = {2: (), 3: (4,), 4: (3, 2), 5: (2, 3, 2)}
RTOL, ATOL = 1e-10, 1e-12

_all_ranks = partial(all_ranks, COMM)


@pytest.fixture(scope="module", autouse=True)
def started():
    hvd.init()
    yield
    hvd.shutdown()


def batch(dims, rows, seed):
    """This rank's input and upstream gradient for ``dims``-D data: channels with different
    means and spreads, shifted per rank, so that per-rank statistics would be wrong."""
    gen = torch.Generator().manual_seed(100 * seed + RANK)
    shape = (rows, CHANNELS) + SPATIAL[dims]
    scale = torch.tensor([1.0, 3.0, 0.5], dtype=torch.float64).view((1, -1) + (1,) * (dims - 2))
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * scale + 10.0 * RANK + 4.0
    return x, torch.randn(shape, generator=gen, dtype=torch.float64)


def gathered(tensor):
    """Every rank's ``tensor``, concatenated along dimension 0 in rank order."""
    return torch.cat([torch.from_numpy(t) for t in COMM.allgather(tensor.detach().numpy())])


def pair(dims, **options):
    """A SyncBatchNorm and the reference module, with the same non-trivial parameters."""
    ours = SyncBatchNorm(CHANNELS, **options).double()
    theirs = REFERENCES[dims](CHANNELS, **options).double()
    if ours.affine:
        with torch.no_grad():
            for module in (ours, theirs):
                module.weight.copy_(torch.tensor([0.5, -1.5, 2.0]))
                module.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
    return ours, theirs


def close(got, expected, what):
    ok = torch.allclose(got, expected, rtol=RTOL, atol=ATOL)
    worst = (got - expected).abs().max().item() if got.numel() else 0.0
    return ok, f"{what}: off by {worst}"


def total(grad):
    """The sum over ranks of a parameter gradient (what the optimizer's allreduce adds)."""
    return torch.from_numpy(COMM.allreduce(grad.numpy(), op=MPI.SUM))


def step(ours, theirs, dims, rows, seed):
    """One forward and backward of both modules; the comparisons as ``(ok, message)``."""
    x, g = batch(dims, rows, seed)
    everyone, g_all = gathered(x), gathered(g)
    offset = sum(COMM.allgather(rows)[:RANK])
    x.requires_grad_(True)
    everyone.requires_grad_(True)
    out, out_all = ours(x), theirs(everyone)
    (out * g).sum().backward()
    (out_all * g_all).sum().backward()
    mine = slice(offset, offset + rows)
    checks = [close(out.detach(), out_all.detach()[mine], "output"),
              close(x.grad, everyone.grad[mine], "input gradient")]
    if ours.affine:
        checks += [close(total(ours.weight.grad), theirs.weight.grad, "weight gradient"),
                   close(total(ours.bias.grad), theirs.bias.grad, "bias gradient")]
        for module in (ours, theirs):
            module.zero_grad()
    return checks


def statistics(ours, theirs):
    checks = [close(ours.running_mean, theirs.running_mean, "running_mean"),
              close(ours.running_var, theirs.running_var, "running_var")]
    counted = ours.num_batches_tracked.item() == theirs.num_batches_tracked.item()
    return checks + [(counted, f"num_batches_tracked {ours.num_batches_tracked.item()} != "
                               f"{theirs.num_batches_tracked.item()}")]


def agree(checks):
    _all_ranks(all(ok for ok, _ in checks), [m for ok, m in checks if not ok])


@pytest.mark.parametrize("dims", [2, 3, 4, 5])
def test_training_matches_one_batch_norm_over_every_rank_batch(dims):
    ours, theirs = pair(dims, momentum=0.3)
    checks = []
    for seed in range(3):   # the running statistics move with every batch
        checks += step(ours, theirs, dims, ROWS[RANK], seed)
    agree(checks + statistics(ours, theirs))


@pytest.mark.parametrize("options", [{"affine": False}, {"momentum": None}],
                         ids=["no-affine", "cumulative"])
def test_options_match_torch(options):
    ours, theirs = pair(4, **options)
    checks = []
    for seed in range(3):
        checks += step(ours, theirs, 4, ROWS[RANK], seed)
    agree(checks + statistics(ours, theirs))


@pytest.mark.mpi(min_size=2)
def test_one_row_per_rank():
    # One row here is too few for batch norm, but SIZE rows together are enough.
    ours, theirs = pair(2)
    agree(step(ours, theirs, 2, 1, seed=5) + statistics(ours, theirs))


def test_evaluation_uses_the_running_statistics_without_communicating():
    ours, theirs = pair(3)
    for seed in range(2):
        step(ours, theirs, 3, ROWS[RANK], seed)
    ours.eval(), theirs.eval()
    calls = []
    ours.allreduce_sum = lambda t: calls.append(t) or horovod_sum(t)
    x, _ = batch(3, 4, seed=9)   # any rows: no rank waits for another
    with torch.no_grad():
        checks = [close(ours(x), theirs(x), "evaluation output"),
                  (not calls, f"{len(calls)} reductions in evaluation")]
    agree(checks)


def test_evaluation_without_running_statistics_uses_every_rank_batch():
    # As Horovod does: with no running statistics, evaluation normalises with the batch's.
    ours, theirs = pair(3, track_running_stats=False)
    ours.eval(), theirs.eval()
    agree(step(ours, theirs, 3, ROWS[RANK], seed=6))


def test_the_sum_over_ranks_is_the_one_given():
    calls = []

    def counted(tensor):
        calls.append(tuple(tensor.shape))
        return horovod_sum(tensor)

    ours = SyncBatchNorm(CHANNELS, allreduce_sum=counted).double()
    theirs = torch.nn.BatchNorm1d(CHANNELS).double()
    checks = step(ours, theirs, 2, ROWS[RANK], seed=7)
    expected = [(CHANNELS + 1,), (CHANNELS,)]
    agree(checks + [(calls == expected, f"reductions {calls}, expected {expected}")])


@pytest.mark.parametrize("shape", [(4,), (2, 3, 1, 1, 1, 1), (4, 2)],
                         ids=["1-D", "6-D", "channels"])
def test_bad_input_is_refused_before_any_communication(shape):
    ours = SyncBatchNorm(CHANNELS, allreduce_sum=lambda t: pytest.fail("communicated"))
    try:
        ours(torch.zeros(shape))
        message = "no error"
    except ValueError as error:
        message = str(error)
    expected = "2-D to 5-D input" if len(shape) != 2 else "dimension 1 must hold the 3"
    _all_ranks(expected in message, [message])


def test_too_few_rows_over_all_ranks_fails_every_rank():
    ours, _ = pair(2)
    x, _ = batch(2, 1 if RANK == 0 else 0, seed=8)
    try:
        ours(x)
        message = "no error"
    except ValueError as error:
        message = str(error)
    _all_ranks("got 1 (" in message and "more than 1 value per channel" in message, [message])
