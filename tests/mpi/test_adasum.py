"""Run under mpirun: ``mpirun -np N python -m pytest --with-mpi tests/mpi/test_adasum.py``
for N = 1, 2, 4 (the sizes Adasum takes) and 3 (where it must refuse, on every rank).

Each rank's result is compared with a NumPy reference that every rank computes itself from
all ranks' inputs (allgathered): the same pairwise combination, up the same binary tree, in
float64. Where the answer is exact in any arithmetic (orthogonal vectors: the sum of
small integers; a zero vector: the identity) it must match bit for bit; elsewhere within a
tolerance derived from the dtype and the number of levels. Every final assertion is
collective (``all_ranks``), so a rank that fails alone cannot leave the others waiting.
"""

from functools import partial

import numpy as np
import pytest
import torch
from mpi4py import MPI

from conftest import all_ranks
from hpctrain.collectives import MismatchError
from hpctrain.collectives.adasum import SQRT_DBL_MIN, adasum_allreduce
from hpctrain.errors import UsageError

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
SIZE, RANK = COMM.Get_size(), COMM.Get_rank()
POWER_OF_TWO = SIZE & (SIZE - 1) == 0
LEVELS = SIZE.bit_length() - 1
DTYPES = ["float16", "float32", "float64"]
COUNTS = [0, 1, 3, 1001]

needs_power_of_two = pytest.mark.skipif(not POWER_OF_TWO,
                                        reason=f"Adasum refuses {SIZE} ranks")
_all_ranks = partial(all_ranks, COMM)


def combine(a, b):
    """The pairwise Adasum of two float64 vectors, with Horovod's zero-norm rule."""
    dot, a_sq, b_sq = a @ b, a @ a, b @ b
    ca = 1.0 - 0.5 * dot / a_sq if a_sq >= SQRT_DBL_MIN else 1.0
    cb = 1.0 - 0.5 * dot / b_sq if b_sq >= SQRT_DBL_MIN else 1.0
    return ca * a + cb * b


def reference(inputs):
    """``(result, scale)``: the Adasum of every rank's input (pairs (0, 1), (2, 3), ...,
    then pairs of pairs) and the largest magnitude met on the way, in float64."""
    level = [np.asarray(x, dtype=np.float64) for x in inputs]
    scale = max((np.abs(x).max(initial=0.0) for x in level), default=0.0)
    while len(level) > 1:
        level = [combine(level[i], level[i + 1]) for i in range(0, len(level), 2)]
        scale = max([scale] + [np.abs(x).max(initial=0.0) for x in level])
    return level[0], scale


def tolerance(dtype, scale):
    """Each level rounds its result to ``dtype`` once (half an ulp of the largest magnitude)
    and the next level's coefficients see those rounded values: two ulps per level, and two
    for the inputs, bound both (measured: under a tenth of that at np = 4; dropping the dot
    products' sum over the group exceeds it 3.5 times in float16, 10^4 times in float32)."""
    return 2 * (LEVELS + 1) * np.finfo(dtype).eps * scale


def random_input(count, dtype, seed=0):
    rng = np.random.default_rng(1000 * seed + RANK)
    return rng.standard_normal(count).astype(dtype)


def as_float64(buf):
    if isinstance(buf, torch.Tensor):
        return buf.to(torch.float64).numpy().reshape(-1)
    return buf.astype(np.float64).reshape(-1)


def check_against_reference(mine, dtype, exact=False):
    """Adasum ``mine`` in place and compare with the reference (collective)."""
    inputs = COMM.allgather(as_float64(mine))
    expected, scale = reference(inputs)
    result = adasum_allreduce(mine, COMM)
    got = as_float64(mine)
    if exact:
        ok = np.array_equal(got, expected)
        worst = 0.0 if ok else float(np.abs(got - expected).max())
        return result is mine and ok, [f"{dtype}: off by up to {worst} (must be exact)"]
    worst = float(np.abs(got - expected).max(initial=0.0))
    bound = tolerance(dtype, scale)
    return result is mine and worst <= bound, [f"{dtype} n={got.size}: off by {worst} > "
                                                f"{bound} (scale {scale})"]


@needs_power_of_two
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", COUNTS)
def test_random_vectors_match_the_reference(dtype, count):
    _all_ranks(*check_against_reference(random_input(count, dtype), dtype))


@needs_power_of_two
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_cpu_tensors_are_reduced_in_place(dtype):
    tensor = torch.from_numpy(random_input(1001, dtype, seed=1))
    address = tensor.data_ptr()
    ok, failures = check_against_reference(tensor, dtype)
    _all_ranks(ok and tensor.data_ptr() == address, failures)


@needs_power_of_two
def test_any_shape_is_combined_as_one_vector():
    array = random_input(6 * 35, "float64", seed=2).reshape(6, 5, 7)
    ok, failures = check_against_reference(array, "float64")
    _all_ranks(ok and array.shape == (6, 5, 7), failures)


@needs_power_of_two
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [1, 3, 1001])
def test_orthogonal_vectors_are_summed(dtype, count):
    # Disjoint supports stay disjoint up the tree: every dot product is exactly 0, every
    # coefficient exactly 1, and sums of small integers are exact, even in float16.
    index = np.arange(count)
    full = (index % 7 + 1) * (-1.0) ** index
    buf = np.where(index % SIZE == RANK, full, 0.0).astype(dtype)
    adasum_allreduce(buf, COMM)
    ok = np.array_equal(buf.astype(np.float64), full)   # each index has one owner
    _all_ranks(ok, [f"{dtype}: {buf[:8]} != sum {full[:8]}"])


@needs_power_of_two
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [1, 3, 1001])
def test_identical_vectors_give_the_vector(dtype, count):
    # Every coefficient is 1/2 up to the rounding of the dot products (a·a and a·b may be
    # summed in different orders by BLAS): a few ulps at most.
    same = np.random.default_rng(7).standard_normal(count).astype(dtype)
    buf = same.copy()
    adasum_allreduce(buf, COMM)
    worst = float(np.abs(buf.astype(np.float64) - same.astype(np.float64)).max())
    bound = 4 * np.finfo(dtype).eps * float(np.abs(same.astype(np.float64)).max())
    _all_ranks(worst <= bound, [f"{dtype}: off by {worst} > {bound}"])


@needs_power_of_two
@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_vectors_give_zero(dtype):
    buf = np.zeros(1001, dtype=dtype)
    adasum_allreduce(buf, COMM)
    _all_ranks(not buf.any() and np.isfinite(buf).all(), [f"{dtype}: {buf[:8]}"])


@needs_power_of_two
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_zero_vector_is_the_identity(dtype):
    # Every even rank holds zeros: the norm below sqrt(DBL_MIN) keeps its coefficient at 1 and
    # the dot product is 0, so at the first level each odd rank's vector passes unchanged
    # (bit for bit), and what follows matches the reference of the odd ranks alone.
    mine = random_input(1001, dtype, seed=3) if RANK % 2 else np.zeros(1001, dtype=dtype)
    inputs = COMM.allgather(mine.astype(np.float64))
    buf = mine.copy()
    adasum_allreduce(buf, COMM)
    if SIZE == 1:
        _all_ranks(not buf.any(), [f"{dtype}: zeros became {buf[:8]}"])
        return
    odd, scale = reference(inputs[1::2])
    worst = float(np.abs(buf.astype(np.float64) - odd).max())
    bound = 0.0 if SIZE == 2 else tolerance(dtype, scale)
    _all_ranks(worst <= bound, [f"{dtype}: off by {worst} > {bound}"])


@needs_power_of_two
def test_one_rank_returns_its_own_vector_untouched():
    mine = random_input(1001, "float32", seed=4)
    buf = mine.copy()
    adasum_allreduce(buf, COMM.Split(RANK, RANK))   # a communicator of this rank alone
    _all_ranks(np.array_equal(buf, mine), ["one rank changed its vector"])


# ----- errors: raised on every rank, never a hang ------------------------------------------------

def raised(call):
    """``(type name, message, exception)`` of what ``call()`` raised, or ``(None, "", None)``."""
    try:
        call()
    except Exception as error:   # whatever it was: the test says which
        return type(error).__name__, str(error), error
    return None, "", None


def test_a_size_that_is_no_power_of_two_is_refused_on_every_rank():
    # At np = 3 the world itself; at np >= 4 a sub-communicator of three ranks.
    if SIZE < 3:
        pytest.skip("needs 3 ranks")
    three = COMM if SIZE == 3 else COMM.Split(0 if RANK < 3 else MPI.UNDEFINED, RANK)
    if three == MPI.COMM_NULL:
        _all_ranks(True)
        return
    name, message, error = raised(lambda: adasum_allreduce(np.ones(5, np.float32), three))
    ok = isinstance(error, UsageError) and "power of two" in message and "got 3" in message
    _all_ranks(ok, [f"{name}: {message}"])


@needs_power_of_two
@pytest.mark.parametrize("buf", [np.ones(4, dtype=np.int32), torch.ones(4, dtype=torch.bfloat16),
                                 np.ones((4, 4), dtype=np.float32)[:, 0]],
                         ids=["int32", "bfloat16", "non-contiguous"])
def test_bad_buffers_are_refused_with_the_remedy(buf):
    name, message, error = raised(lambda: adasum_allreduce(buf, COMM))
    ok = isinstance(error, UsageError) and ("valid choices: float16, float32, float64"
                                            in message or "contiguous" in message)
    _all_ranks(ok, [f"{name}: {message}"])


@pytest.mark.mpi(min_size=2)
@needs_power_of_two
def test_a_bad_buffer_on_one_rank_fails_every_rank():
    buf = np.ones(8, dtype=np.int32 if RANK == SIZE - 1 else np.float32)
    name, message, error = raised(lambda: adasum_allreduce(buf, COMM))
    _all_ranks(isinstance(error, UsageError), [f"{name}: {message}"])


@pytest.mark.mpi(min_size=2)
@needs_power_of_two
def test_different_sizes_fail_every_rank():
    buf = np.ones(8 + (RANK == 0), dtype=np.float32)
    name, message, error = raised(lambda: adasum_allreduce(buf, COMM))
    ok = isinstance(error, MismatchError) and "count differs: from 8 to 9" in message
    _all_ranks(ok, [f"{name}: {message}"])


@pytest.mark.mpi(min_size=2)
@needs_power_of_two
def test_different_dtypes_fail_every_rank():
    buf = np.ones(8, dtype=np.float64 if RANK == 0 else np.float32)
    name, message, error = raised(lambda: adasum_allreduce(buf, COMM))
    ok = isinstance(error, MismatchError) and "dtype differs" in message
    _all_ranks(ok, [f"{name}: {message}"])
