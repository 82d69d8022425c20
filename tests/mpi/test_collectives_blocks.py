"""allgather, reduce_scatter, alltoall, broadcast, reduce under mpirun: ``mpirun -np N
python -m pytest --with-mpi tests/mpi/test_collectives_blocks.py``.

Every algorithm of each collective (from ``REGISTRIES``) x
block sizes (all empty, one element each, fewer elements than ranks, uneven with an empty
block, prime, about a million) x dtypes (any dtype for the three that move bytes; ``DTYPES``
x every op for reduce_scatter and reduce), broadcast and reduce from every root, on
integer-valued data whose sums and products are exact in any order, against a NumPy
reference, bit for bit. Every final assertion is collective (``all_ranks``). At np = 1 each
collective copies this rank's block (broadcast: leaves the root's vector; reduce: copies
it, divided by 1 for avg): the checks there show the copy lands in place; the argument
checks are real at every size.
"""

from functools import partial

import numpy as np
import pytest
import torch
from mpi4py import MPI

from conftest import abort_on_error, all_ranks
from hpctrain.collectives import (DTYPES, OPS, REGISTRIES, allgather, allreduce, alltoall,
                                  broadcast, reduce, reduce_scatter)
from hpctrain.errors import UsageError

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
SIZE, RANK = COMM.Get_size(), COMM.Get_rank()
_all_ranks = partial(all_ranks, COMM)
#: The dtypes allgather and alltoall move: any, as bytes (bfloat16 and the rest as torch).
BYTE_DTYPES = ["bool", "uint8", "int8", "int16", "float16", "bfloat16", "float32",
               "float64", "complex64", "int64"]
BIG = (1 << 20) + 3     # elements in all: not a multiple of p


def split(total, size=SIZE):
    """``total`` elements in ``size`` blocks differing by at most one."""
    return [total // size + (r < total % size) for r in range(size)]


def count_patterns(size=SIZE):
    """Per-rank block sizes, by name."""
    return {"empty": [0] * size, "one": [1] * size,
            "fewer than ranks": [1] * (size - 1) + [0],
            "uneven": [(7, 0, 19, 2)[r % 4] + r for r in range(size)],
            "prime": split(1009, size), "large": split(BIG, size)}


def values(rank, count, salt, op="sum"):
    """Integers in [-8, 8] (sums of 4 exact even in bfloat16), or [-2, 2] for ``prod``."""
    raw = np.arange(count, dtype=np.int64) * 7 + rank * 13 + salt
    return raw % 5 - 2 if op == "prod" else raw % 17 - 8


def make(raw, dtype):
    """``raw`` (int64) as a buffer of ``dtype``: NumPy, or torch for bfloat16."""
    if dtype == "bfloat16":
        return torch.tensor(raw, dtype=torch.bfloat16)
    return raw.astype(np.dtype(dtype))


def empty(count, dtype):
    if dtype == "bfloat16":
        return torch.full((count,), -99.0, dtype=torch.bfloat16)
    return np.full(count, 3, dtype=np.dtype(dtype))


def bits(buf):
    """The raw bytes of an array or tensor, to compare exactly whatever the dtype."""
    if isinstance(buf, torch.Tensor):
        return buf.view(torch.int16).numpy().tobytes()
    return buf.tobytes()


def offsets(counts):
    return np.concatenate([[0], np.cumsum(counts)]).astype(int)


def message(call):
    try:
        call()
    except UsageError as exc:
        return str(exc)
    return ""


# ----- allgather --------------------------------------------------------------------------------

def gather_case(algo, dtype, name, counts, salt):
    send = make(values(RANK, counts[RANK], salt), dtype)
    recv = empty(sum(counts), dtype)
    out = abort_on_error(allgather, send, recv, counts, algo=algo)
    want = make(np.concatenate([values(r, counts[r], salt) for r in range(SIZE)]), dtype)
    if out is not recv or bits(recv) != bits(want):
        return f"allgather {algo} {dtype} {name} {counts}"
    return None


@pytest.mark.parametrize("algo", sorted(REGISTRIES["allgather"]))
def test_allgather_matches_the_reference(algo):
    failures = []
    for dtype in BYTE_DTYPES:
        for salt, (name, counts) in enumerate(count_patterns().items()):
            if name == "large" and dtype not in ("float32", "bfloat16"):
                continue
            failures.append(gather_case(algo, dtype, name, counts, salt))
    failures = [f for f in failures if f]
    _all_ranks(not failures, failures)


def test_allgather_of_torch_tensors_into_a_tensor():
    failures = []
    for algo in sorted(REGISTRIES["allgather"]):
        counts = count_patterns()["uneven"]
        send = torch.tensor(values(RANK, counts[RANK], 1), dtype=torch.float16)
        recv = torch.zeros(sum(counts), dtype=torch.float16)
        allgather(send, recv, counts, algo=algo)
        want = np.concatenate([values(r, counts[r], 1) for r in range(SIZE)])
        if not np.array_equal(recv.numpy(), want.astype(np.float16)):
            failures.append(algo)
    _all_ranks(not failures, failures)


# ----- reduce_scatter ---------------------------------------------------------------------------

def reduced_reference(dtype, op, total, salt):
    """The whole reduced vector, exactly as reduce_scatter (block by block) and reduce (on
    the root) must give it, as float64."""
    stacked = np.stack([values(r, total, salt, op) for r in range(SIZE)])
    reduced = {"sum": np.sum, "avg": np.sum, "min": np.min, "max": np.max,
               "prod": np.prod}[op](stacked, axis=0)
    if op == "avg":
        if DTYPES[dtype].integer:
            reduced = np.floor_divide(reduced, SIZE)
        else:   # the exact sum divided, rounded once to the dtype
            quotient = torch.tensor(reduced / SIZE, dtype=torch.float64)
            return quotient.to(getattr(torch, dtype)).to(torch.float64).numpy()
    return reduced.astype(np.float64)


def as_float64(buf):
    if isinstance(buf, torch.Tensor):
        return buf.to(torch.float64).numpy()
    return buf.astype(np.float64)


def scatter_case(algo, dtype, op, name, counts, salt, kind="numpy"):
    total = sum(counts)
    send = make(values(RANK, total, salt, op), dtype)
    recv = empty(counts[RANK], dtype)
    if kind == "torch" and isinstance(send, np.ndarray):
        send, recv = torch.from_numpy(send), torch.from_numpy(recv)
    out = abort_on_error(reduce_scatter, send, recv, counts, op=op, algo=algo)
    lo, hi = offsets(counts)[RANK:RANK + 2]
    want = reduced_reference(dtype, op, total, salt)[lo:hi]
    got = as_float64(recv)
    if out is not recv or not np.array_equal(got, want):
        wrong = np.flatnonzero(got != want)
        first = f", first at {wrong[0]}: got {got[wrong[0]]}, want {want[wrong[0]]}" \
            if wrong.size else ""
        return f"reduce_scatter {algo} {dtype} {op} {name} {counts}{first}"
    return None


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("algo", sorted(REGISTRIES["reducescatter"]))
def test_reduce_scatter_matches_the_reference(algo, dtype):
    failures = []
    for op in sorted(OPS):
        for salt, (name, counts) in enumerate(count_patterns().items()):
            if name == "large" and (op not in ("sum", "prod") or dtype == "float64"):
                continue
            failures.append(scatter_case(algo, dtype, op, name, counts, salt))
    failures = [f for f in failures if f]
    _all_ranks(not failures, failures)


def test_reduce_scatter_of_torch_tensors():
    failures = [f for algo in sorted(REGISTRIES["reducescatter"])
                for dtype in ("float32", "int64") for op in ("avg", "prod")
                if (f := scatter_case(algo, dtype, op, "uneven", count_patterns()["uneven"], 3,
                                      kind="torch"))]
    _all_ranks(not failures, failures)


# ----- alltoall ---------------------------------------------------------------------------------

def exchange_counts(sender, receiver, pattern):
    """Elements rank ``sender`` sends rank ``receiver``: known to both, so counts agree."""
    if pattern == "empty":
        return 0
    if pattern == "one":
        return 1
    if pattern == "uneven":
        return (3 * sender + 5 * receiver) % 4        # zeros among them
    if pattern == "prime":
        return 13
    return BIG // (SIZE * SIZE) + (sender == receiver)  # large


def block(sender, receiver, count, salt):
    return values(sender * 31 + receiver, count, salt)


def exchange_case(algo, dtype, pattern, salt):
    sendcounts = [exchange_counts(RANK, j, pattern) for j in range(SIZE)]
    recvcounts = [exchange_counts(i, RANK, pattern) for i in range(SIZE)]
    send = make(np.concatenate([block(RANK, j, sendcounts[j], salt) for j in range(SIZE)]),
                dtype)
    recv = empty(sum(recvcounts), dtype)
    out = abort_on_error(alltoall, send, sendcounts, recv, recvcounts, algo=algo)
    want = make(np.concatenate([block(i, RANK, recvcounts[i], salt) for i in range(SIZE)]),
                dtype)
    if out is not recv or bits(recv) != bits(want):
        return f"alltoall {algo} {dtype} {pattern}"
    return None


@pytest.mark.parametrize("algo", sorted(REGISTRIES["alltoall"]))
def test_alltoall_matches_the_reference(algo):
    failures = []
    for dtype in BYTE_DTYPES:
        for salt, pattern in enumerate(("empty", "one", "uneven", "prime", "large")):
            if pattern == "large" and dtype not in ("float32", "bfloat16"):
                continue
            failures.append(exchange_case(algo, dtype, pattern, salt))
    failures = [f for f in failures if f]
    _all_ranks(not failures, failures)


# ----- broadcast --------------------------------------------------------------------------------

def broadcast_counts(size=SIZE):
    """Vector lengths, by name: the byte counts that matter to scatter_allgather's p chunks
    come from these times the dtype's size (bool and uint8: one byte each)."""
    return {"empty": 0, "one": 1, "fewer than ranks": max(size - 1, 1), "prime": 1009,
            "large": BIG}


def broadcast_case(algo, dtype, name, count, root, salt):
    # Every rank starts from values of its own, so a rank that kept its own shows.
    buf = make(values(RANK, count, salt), dtype)
    out = abort_on_error(broadcast, buf, root, algo)
    want = make(values(root, count, salt), dtype)
    if out is not buf or bits(buf) != bits(want):
        return f"broadcast {algo} {dtype} {name} ({count}) from root {root}"
    return None


@pytest.mark.parametrize("algo", sorted(REGISTRIES["broadcast"]))
def test_broadcast_matches_the_root_from_every_root(algo):
    failures = []
    for root in range(SIZE):
        for dtype in BYTE_DTYPES:
            for salt, (name, count) in enumerate(broadcast_counts().items()):
                if name == "large" and dtype not in ("float32", "bfloat16"):
                    continue
                failures.append(broadcast_case(algo, dtype, name, count, root, salt + root))
    failures = [f for f in failures if f]
    _all_ranks(not failures, failures)


def test_broadcast_of_tensors_of_any_shape_on_a_split_communicator():
    # A communicator of its own (the even and the odd ranks): its own private duplicate,
    # roots numbered within it; a torch tensor of three dimensions; the root's read-only.
    sub = COMM.Split(RANK % 2, RANK)
    failures = []
    try:
        for algo in sorted(REGISTRIES["broadcast"]):
            root = sub.Get_size() - 1
            tensor = torch.full((3, 5, 7), float(sub.Get_rank()), dtype=torch.float16)
            out = broadcast(tensor, root, algo, sub)
            if out is not tensor or not bool((tensor == root).all()):
                failures.append(f"{algo}: tensor")
            array = np.arange(11, dtype=np.int32) * (sub.Get_rank() + 1)
            array.flags.writeable = sub.Get_rank() != root
            broadcast(array, root, algo, sub)
            if array.tolist() != [i * (root + 1) for i in range(11)]:
                failures.append(f"{algo}: read-only root")
    finally:
        sub.Free()
    _all_ranks(not failures, failures)


# ----- reduce ----------------------------------------------------------------------------------

def reduce_case(algo, dtype, op, name, count, root, salt):
    """One reduce to ``root``. Off the root ``recv`` is ``None`` or, every other salt, a
    buffer that must come back untouched; on the root ``send`` must be left as it was."""
    send = make(values(RANK, count, salt, op), dtype)
    sent = bits(send)
    recv = empty(count, dtype) if RANK == root or salt % 2 else None
    before = None if recv is None else bits(recv)
    out = abort_on_error(reduce, send, recv, op=op, root=root, algo=algo)
    what = f"reduce {algo} {dtype} {op} {name} ({count}) to root {root}"
    if out is not recv:
        return f"{what}: returned another object than recv"
    if RANK != root:
        after = None if out is None else bits(out)
        return f"{what}: recv written off the root" if after != before else None
    want, got = reduced_reference(dtype, op, count, salt), as_float64(recv)
    if not np.array_equal(got, want):
        wrong = np.flatnonzero(got != want)
        return f"{what}: first wrong at {wrong[0]}: got {got[wrong[0]]}, want {want[wrong[0]]}"
    if bits(send) != sent:
        return f"{what}: the root's send was written"
    return None


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("algo", sorted(REGISTRIES["reduce"]))
def test_reduce_matches_the_reference_from_every_root(algo, dtype):
    failures = []
    for root in range(SIZE):
        for op in sorted(OPS):
            for salt, (name, count) in enumerate(broadcast_counts().items()):
                # About a million elements: sum and prod, from the last root only.
                if name == "large" and (op not in ("sum", "prod") or root != SIZE - 1):
                    continue
                failures.append(reduce_case(algo, dtype, op, name, count, root, salt + root))
    failures = [f for f in failures if f]
    _all_ranks(not failures, failures)


def test_reduce_of_tensors_of_any_shape_on_a_split_communicator():
    # A communicator of its own (the even and the odd ranks): its own private duplicate,
    # roots numbered within it; a torch tensor of three dimensions; the root's send a
    # read-only array.
    sub = COMM.Split(RANK % 2, RANK)
    size, rank = sub.Get_size(), sub.Get_rank()
    failures = []
    try:
        for algo in sorted(REGISTRIES["reduce"]):
            root = size - 1
            tensor = torch.full((3, 5, 7), float(rank + 1), dtype=torch.bfloat16)
            total = torch.zeros((3, 5, 7), dtype=torch.bfloat16) if rank == root else None
            reduce(tensor, total, "sum", root, algo, sub)
            if rank == root and not bool((total == size * (size + 1) // 2).all()):
                failures.append(f"{algo}: tensor")
            array = np.arange(11, dtype=np.int32) * (rank + 1)
            array.flags.writeable = rank != root
            out = np.zeros(11, dtype=np.int32) if rank == root else None
            reduce(array, out, "max", root, algo, sub)
            if rank == root and out.tolist() != [i * size for i in range(11)]:
                failures.append(f"{algo}: read-only root")
    finally:
        sub.Free()
    _all_ranks(not failures, failures)


def test_reduce_bad_arguments_raise_on_every_rank_with_what_would_be_right():
    # Every rank makes each bad call, as its own root where the root's buffers are wrong:
    # each raises on its own, before any message, and no rank waits for another.
    ones = np.ones(SIZE)
    read_only = np.ones(SIZE)
    read_only.flags.writeable = False
    cases = {
        f"reduce: root={SIZE} is not a rank of the communicator: valid values are 0 to "
        f"{SIZE - 1}": lambda: reduce(ones, ones, root=SIZE),
        "root=-1 is not a rank": lambda: reduce(ones, ones, root=-1),
        "root=True is not a rank": lambda: reduce(ones, ones, root=True),
        f"reduce: recv has {SIZE + 1} elements, but the length of send (every rank's "
        f"vector) is {SIZE}: pass a recv buffer of {SIZE} elements":
            lambda: reduce(ones, np.ones(SIZE + 1), root=RANK),
        f"reduce: recv is None on the root (rank {RANK}): pass a recv buffer of {SIZE} "
        f"elements there": lambda: reduce(ones, None, root=RANK),
        "unknown reduce op 'xor'; valid choices: avg, max, min, prod, sum":
            lambda: reduce(ones, ones, op="xor", root=RANK),
        "unknown reduce algorithm 'ring'; valid choices: mpi, tree":
            lambda: reduce(ones, ones, root=RANK, algo="ring"),
        "reduce does not support dtype complex64; valid choices": lambda: reduce(
            np.ones(SIZE, np.complex64), np.ones(SIZE, np.complex64), root=RANK),
        "reduce: send is float64 but recv is float32: both buffers must have the same dtype":
            lambda: reduce(ones, np.ones(SIZE, np.float32), root=RANK),
        "reduce needs a contiguous buffer": lambda: reduce(np.ones(4 * SIZE)[::2], ones,
                                                           root=RANK),
    }
    if SIZE > 1:   # off the root send is workspace: a read-only one is refused there
        cases["writes into the array"] = lambda: reduce(read_only, None, root=(RANK + 1) % SIZE)
    missing = [f"{expected!r}: got {message(call)!r}" for expected, call in cases.items()
               if expected not in message(call)]
    total = np.zeros(SIZE) if RANK == 0 else None
    reduce(np.full(SIZE, RANK + 1.0), total, root=0)     # a correct call after them, on all
    works = RANK != 0 or total.tolist() == [SIZE * (SIZE + 1) / 2] * SIZE
    _all_ranks(not missing and works, missing)


# ----- allreduce with prod ------------------------------------------------------------------------

def test_allreduce_prod_is_exact_for_every_algorithm():
    # The allreduce suite runs prod too (OPS); here at a size where every algorithm's
    # large-message path (Rabenseifner, the ring's chunks) multiplies.
    failures = []
    for algo in sorted(set(REGISTRIES["allreduce"]) - {"horovod"}):
        buf = values(RANK, 70001, 2, "prod").astype(np.float32)
        allreduce(buf, op="prod", algo=algo)
        want = np.prod(np.stack([values(r, 70001, 2, "prod") for r in range(SIZE)]), axis=0)
        if not np.array_equal(buf, want.astype(np.float32)):
            failures.append(algo)
    _all_ranks(not failures, failures)


# ----- bad arguments: raised on this rank, before any message -----------------------------

def still_works():
    """A correct call of each collective after the errors: nothing was left in flight."""
    recv = np.zeros(SIZE, dtype=np.int32)
    allgather(np.array([RANK], dtype=np.int32), recv, [1] * SIZE)
    return recv.tolist() == list(range(SIZE))


def test_bad_arguments_raise_with_what_would_be_right():
    ones, counts = np.ones(SIZE), [1] * SIZE
    read_only = np.ones(SIZE)
    read_only.flags.writeable = False
    cases = {
        "counts has": lambda: allgather(np.ones(1), ones, [1] * (SIZE + 1)),
        "pass a recv buffer of": lambda: allgather(np.ones(1), np.ones(SIZE + 1), counts),
        "pass a send buffer of": lambda: allgather(np.ones(2), ones, counts),
        "is negative": lambda: allgather(np.ones(1), ones, [-1] + [2] * (SIZE - 1)),
        "sequence of": lambda: allgather(np.ones(1), ones, 3),
        "valid choices: butterfly, mpi, ring": lambda: allgather(np.ones(1), ones, counts,
                                                                 algo="bruck"),
        "same dtype": lambda: allgather(np.ones(1, np.float32), ones, counts),
        "read-only": lambda: allgather(np.ones(1), read_only, counts),
        "np.ascontiguousarray": lambda: allgather(np.ones(4)[::2], ones, counts),
        "valid choices: avg, max, min, prod, sum": lambda: reduce_scatter(ones, np.ones(1),
                                                                          counts, op="xor"),
        "does not support dtype complex64": lambda: reduce_scatter(
            np.ones(SIZE, np.complex64), np.ones(1, np.complex64), counts),
        "send is float64 but recv is float32": lambda: reduce_scatter(
            ones, np.ones(1, np.float32), counts),
        "reduce_scatter: send has": lambda: reduce_scatter(np.ones(SIZE + 2), np.ones(1),
                                                           counts),
        "valid choices: mpi, pairwise": lambda: alltoall(ones, counts, ones, counts,
                                                         algo="ring"),
        "the block a rank sends itself": lambda: alltoall(
            ones, counts, np.ones(SIZE + 1), [1] * RANK + [2] + [1] * (SIZE - RANK - 1)),
        "sum(sendcounts)": lambda: alltoall(np.ones(SIZE + 3), counts, ones, counts),
        f"root={SIZE} is not a rank of the communicator: valid values are 0 to {SIZE - 1}":
            lambda: broadcast(ones, SIZE),
        "root=1.0 is not a rank": lambda: broadcast(ones, 1.0),
        "valid choices: mpi, scatter_allgather, tree": lambda: broadcast(ones, algo="bcast"),
        "broadcast needs a contiguous buffer": lambda: broadcast(np.ones(4)[::2]),
    }
    # Only rank 0 makes the bad calls: if one of them sent anything, the others would meet
    # it in the correct call that follows.
    missing = [f"{expected!r}: got {message(call)!r}" for expected, call in cases.items()
               if RANK == 0 and expected not in message(call)]
    works = still_works()    # on every rank, whatever rank 0 found
    _all_ranks(not missing and works, missing)


def test_counts_may_be_numpy_integers():
    counts = np.full(SIZE, 2, dtype=np.int64)
    recv = np.zeros(2 * SIZE, dtype=np.int64)
    allgather(np.full(2, RANK), recv, counts, algo="butterfly")
    _all_ranks(recv.tolist() == [r for r in range(SIZE) for _ in range(2)])
