"""Run under mpirun: ``mpirun -np N python -m pytest --with-mpi tests/mpi/test_collectives.py``.

Every algorithm, dtype, op, odd size and root is checked against a NumPy reference on data
whose sums are exact in any order (small integers, even in float16 and bfloat16), so every
algorithm must agree with the reference bit for bit. Every final assertion is collective
(``_all_ranks``): a rank that fails alone would otherwise leave the others waiting in the
next collective.

At np = 1 every algorithm is the identity: a one-rank plan has an empty data phase
(``plans.py``), so the reference checks there only confirm that the buffer comes back with
its own values. What np = 1 does test for real is said by
``test_the_result_is_written_into_the_callers_buffer`` (same object, memory, dtype, shape
and bits) and by the argument checks, fused buffers and sub-communicators, which run at every
size.
"""

import tracemalloc
from functools import partial

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from conftest import abort_on_error, all_ranks
from hpctrain.collectives import (ALGORITHMS, DTYPES, OPS, Algorithm, MismatchError,
                                  allreduce, allreduce_fused, available, context)
from hpctrain.errors import UsageError

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
SIZE, RANK = COMM.Get_size(), COMM.Get_rank()
#: The algorithms that move the data themselves (a schedule of their own), by the registry.
OURS = sorted(name for name, a in ALGORITHMS.items()
              if type(a).schedule is not Algorithm.schedule)
# Horovod has tests of its own at the end of this file: once started, its background thread
# busy-polls MPI every millisecond and slows everything after it on a small machine.
ALGOS = sorted(set(ALGORITHMS) - {"horovod"})
HOROVOD = "horovod" in available()
BIG_BYTES = 1 << 20


_all_ranks = partial(all_ranks, COMM)


def variants(algo, size=SIZE):
    """The option settings worth testing for ``algo`` on ``size`` ranks: the algorithm's own
    examples (every root, every number of servers, every split of the ranks into nodes)."""
    return ALGORITHMS[algo].examples(size)


def small_sizes(size=SIZE):
    return sorted({0, 1, max(size - 1, 0), size, size + 1, 1009})


def contribution(rank, count, salt, op="sum"):
    """Rank ``rank``'s values: integers in [-8, 8], so that any sum of 4 is exact in every
    dtype (bfloat16 holds integers up to 256 exactly); for ``prod``, in [-2, 2], so that
    any product of 4, in any order, is too."""
    values = np.arange(count, dtype=np.int64) * 7 + rank * 13 + salt
    return values % 5 - 2 if op == "prod" else values % 17 - 8


def make_buffer(values, dtype, kind="numpy"):
    """``values`` as a NumPy array (``kind="numpy"``; bfloat16 is always torch) or tensor."""
    if dtype == "bfloat16" or kind == "torch":
        return torch.tensor(values, dtype=getattr(torch, dtype))
    return values.astype(dtype)


def as_reference_type(buf):
    """The buffer's values as float64 or int64 NumPy, for exact comparison."""
    if isinstance(buf, torch.Tensor):
        integer = not buf.dtype.is_floating_point
        return buf.to(torch.int64 if integer else torch.float64).numpy().reshape(-1)
    return buf.astype(np.int64 if buf.dtype.kind == "i" else np.float64).reshape(-1)


def reference(dtype, op, count, salt, size=SIZE):
    """What ``allreduce`` must produce, exactly, in ``dtype``, as float64 or int64."""
    stacked = np.stack([contribution(r, count, salt, op) for r in range(size)]) if count \
        else np.zeros((size, 0), dtype=np.int64)
    if op == "min":
        result = stacked.min(axis=0)
    elif op == "max":
        result = stacked.max(axis=0)
    elif op == "prod":
        result = stacked.prod(axis=0)
    else:
        result = stacked.sum(axis=0)
    if op == "avg":
        if DTYPES[dtype].integer:
            return np.floor_divide(result, size)
        # The exact sum, divided and rounded once to the dtype, as allreduce does.
        quotient = torch.tensor(result / size, dtype=torch.float64)
        return quotient.to(getattr(torch, dtype)).to(torch.float64).numpy()
    return result


def mismatches(algo, dtype, op, got, want):
    """Indices where ``got`` is not ``want``: exact, except one ulp for Horovod's average."""
    if algo == "horovod" and op == "avg" and not DTYPES[dtype].integer:
        # hvd.Average multiplies by 1/p, which may round one ulp off the exact quotient.
        tolerance = torch.finfo(getattr(torch, dtype)).eps * np.abs(want)
        got = np.where(np.abs(got - want) <= tolerance, want, got)
    return np.flatnonzero(got != want)


def run_case(algo, dtype, op, count, options, salt, kind="numpy", check=True):
    """One allreduce of this rank's contribution; a description of what went wrong, or None."""
    buf = make_buffer(contribution(RANK, count, salt, op), dtype, kind)
    out = abort_on_error(allreduce, buf, op=op, algo=algo, check=check, **options)
    got, want = as_reference_type(buf), reference(dtype, op, count, salt)
    if out is not buf:
        return f"{algo} {dtype} {op} n={count} {options}: did not return its buffer"
    wrong = mismatches(algo, dtype, op, got, want)
    if wrong.size:
        return (f"{algo} {dtype} {op} n={count} {options}: {wrong.size} wrong, first at "
                f"{wrong[0]}: got {got[wrong[0]]}, want {want[wrong[0]]}")
    return None


# ----- every algorithm x dtype x op x size x root ---------------------------------------------

@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("algo", ALGOS)
def test_small_and_odd_sizes_match_the_reference(algo, dtype):
    failures = []
    for op in sorted(OPS):
        for count in small_sizes():
            for opts in variants(algo):
                failure = run_case(algo, dtype, op, count, opts, salt=count)
                if failure:
                    failures.append(failure)
    _all_ranks(not failures, failures)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("algo", ALGOS)
def test_a_megabyte_and_more_matches_the_reference(algo, dtype):
    # Every op, and every root, servers count or butterfly variant: at this size the
    # Rabenseifner halving, the ring's uneven chunks and the servers' shards all have
    # thousands of elements, and the half types are reduced slice by slice through torch.
    count = BIG_BYTES // DTYPES[dtype].itemsize + 3     # + 3: not a multiple of p
    failures = [f for op in sorted(OPS) for opts in variants(algo)
                if (f := run_case(algo, dtype, op, count, opts, salt=5))]
    _all_ranks(not failures, failures)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_torch_tensors_of_any_shape_are_reduced_in_place(dtype):
    failures = []
    for algo in ALGOS:
        for op in ("sum", "avg", "max"):
            values = contribution(RANK, 2 * 3 * 5, salt=1)
            tensor = torch.tensor(values.reshape(2, 3, 5), dtype=getattr(torch, dtype))
            allreduce(tensor, op=op, algo=algo)
            want = reference(dtype, op, 30, salt=1)
            wrong = mismatches(algo, dtype, op, as_reference_type(tensor), want)
            if tensor.shape != (2, 3, 5) or wrong.size:
                failures.append(f"{algo} {dtype} {op}")
    _all_ranks(not failures, failures)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_the_result_is_written_into_the_callers_buffer(kind):
    # allreduce works in place at every size: the caller's object comes back, in the same
    # memory, with its dtype and shape. At np = 1 that is all allreduce does (the identity):
    # the bits must come back untouched, whatever the algorithm, op or dtype.
    failures = []
    for algo in ALGOS:
        for dtype in sorted(DTYPES):
            for op in sorted(OPS):
                values = contribution(RANK, 7 * 11, salt=4, op=op).reshape(7, 11)
                buf = make_buffer(values, dtype, kind)
                before, where = _bits(buf), _address(buf)
                out = allreduce(buf, op=op, algo=algo)
                kept = out is buf and _address(buf) == where and buf.shape == (7, 11) \
                    and str(buf.dtype).endswith(dtype)
                right = _bits(buf) == before if SIZE == 1 else \
                    not mismatches(algo, dtype, op, as_reference_type(buf),
                                   reference(dtype, op, 77, salt=4)).size
                if not (kept and right):
                    failures.append(f"{algo} {kind} {dtype} {op}: kept {kept}, right {right}")
    _all_ranks(not failures, failures)


def _bits(buf):
    """The buffer's bytes (bfloat16 has no NumPy dtype: through a uint8 view)."""
    if isinstance(buf, torch.Tensor):
        return buf.view(-1).view(torch.uint8).numpy().tobytes()
    return buf.tobytes()


def _address(buf):
    return buf.data_ptr() if isinstance(buf, torch.Tensor) else buf.ctypes.data


def test_check_false_gives_the_same_results():
    failures = [f for algo in ALGOS for count in (1, SIZE + 1, 1009)
                if (f := run_case(algo, "float32", "sum", count, {}, salt=3, check=False))]
    _all_ranks(not failures, failures)


def test_a_buffer_changed_in_place_between_calls_is_seen():
    # The second call on the same object takes the last-call fast path: it must notice a
    # tensor resized or retyped in place, and an array made read-only.
    failures = []
    for algo in ("butterfly", "ring"):
        tensor = torch.ones(5)
        allreduce(tensor, algo=algo)
        tensor.resize_(2).fill_(1.0)      # same memory, fewer elements
        allreduce(tensor, algo=algo)
        # The 3 elements past the tensor's end are still in its memory: untouched.
        whole = torch.empty(0).set_(tensor.untyped_storage(), 0, (5,))
        if not torch.equal(whole, torch.full((5,), float(SIZE))):
            failures.append(f"{algo}: resized tensor {tensor.tolist()}")
        tensor = torch.ones(2)
        allreduce(tensor, algo=algo)
        tensor.data = torch.ones(2, dtype=torch.float32).view(torch.int32).fill_(1)
        allreduce(tensor, algo=algo)
        if tensor.dtype != torch.int32 or tensor.tolist() != [SIZE, SIZE]:
            failures.append(f"{algo}: retyped tensor {tensor.tolist()}")
        array = np.ones(2)
        allreduce(array, algo=algo)
        array.flags.writeable = False
        if "read-only" not in _message(lambda: allreduce(array, algo=algo)):
            failures.append(f"{algo}: a read-only array was accepted")
    _all_ranks(not failures and _still_works(), failures)


def test_a_multidimensional_numpy_array_keeps_its_shape():
    array = contribution(RANK, 24, salt=2).reshape(2, 3, 4).astype(np.float64)
    allreduce(array, algo="butterfly")
    ok = array.shape == (2, 3, 4) and np.array_equal(array.reshape(-1),
                                                     reference("float64", "sum", 24, salt=2))
    _all_ranks(ok)


def test_every_rank_gets_the_same_bits_on_real_valued_data():
    # Not exactly summable, so the order of additions shows in the last bits: each
    # algorithm must still give every rank the same bits, within the rounding bound.
    failures = []
    for algo in ALGOS:
        for i, opts in enumerate(variants(algo)):
            everyone = [np.random.default_rng([7, i, r]).standard_normal(1009).astype(np.float32)
                        for r in range(SIZE)]
            data = everyone[RANK].copy()
            allreduce(data, algo=algo, **opts)
            exact = np.sum(everyone, axis=0, dtype=np.float64)
            bound = SIZE * np.finfo(np.float32).eps * np.sum(np.abs(everyone), axis=0)
            if len(set(COMM.allgather(data.tobytes()))) != 1:
                failures.append(f"{algo} {opts}: ranks disagree")
            if (np.abs(data - exact) > bound).any():
                failures.append(f"{algo} {opts}: error {np.max(np.abs(data - exact))}")
    _all_ranks(not failures, failures)


# ----- property-based: random sizes, dtypes, ops and options -----------------------------------

def _options(algo):
    return st.sampled_from(variants(algo))


@settings(max_examples=40, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.generate, Phase.shrink])
@given(count=st.integers(0, 3000), dtype=st.sampled_from(sorted(DTYPES)),
       op=st.sampled_from(sorted(OPS)), salt=st.integers(0, 1 << 16),
       algo_options=st.sampled_from(ALGOS).flatmap(
           lambda algo: st.tuples(st.just(algo), _options(algo))))
def test_random_calls_match_the_reference(count, dtype, op, salt, algo_options):
    # derandomize: every rank draws the same examples, so every rank makes the same calls;
    # no deadline or health check, which could fail on one rank only and leave the rest
    # waiting.
    algo, options = algo_options
    failure = run_case(algo, dtype, op, count, options, salt)
    _all_ranks(failure is None, [failure] if failure else [])


# ----- mismatched calls: every rank raises, none hangs -------------------------------------------

def _raises_everywhere(call, own=None):
    """Run ``call`` on every rank; True on every rank iff each raised the expected error:
    ``own`` (a predicate on the rank) picks the ranks that must raise their own UsageError
    rather than a MismatchError."""
    try:
        call()
    except MismatchError as exc:
        ok = not (own and own(RANK)) and "different arguments" in str(exc)
        return ok, [] if ok else [f"unexpected MismatchError: {exc}"]
    except UsageError as exc:
        ok = bool(own and own(RANK))
        return ok, [] if ok else [f"unexpected UsageError: {exc}"]
    return False, ["no error raised"]


def _still_works():
    buf = np.full(SIZE + 1, RANK, dtype=np.int64)
    allreduce(buf, algo="ring")
    return bool((buf == SIZE * (SIZE - 1) // 2).all())


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algo", ALGOS)
def test_different_lengths_raise_on_every_rank(algo):
    ok, fails = _raises_everywhere(
        lambda: allreduce(np.ones(5 + (RANK == 0), dtype=np.float32), algo=algo))
    _all_ranks(ok and _still_works(), fails)


@pytest.mark.mpi(min_size=2)
def test_different_dtypes_raise_on_every_rank():
    dtype = np.float64 if RANK == SIZE - 1 else np.float32
    ok, fails = _raises_everywhere(lambda: allreduce(np.ones(7, dtype=dtype), algo="butterfly"))
    _all_ranks(ok and _still_works(), fails)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("field", ["op", "algo", "root"])
def test_different_op_algo_or_root_raise_on_every_rank(field):
    kwargs = {"op": "sum", "algo": "tree", "root": 0}
    kwargs[field] = {"op": "max", "algo": "ps", "root": 1}[field] if RANK == 1 else kwargs[field]
    ok, fails = _raises_everywhere(lambda: allreduce(np.ones(4), **kwargs))
    _all_ranks(ok and _still_works(), fails)


@pytest.mark.mpi(min_size=2)
def test_a_bad_argument_on_one_rank_raises_there_and_mismatch_elsewhere():
    cases = [np.ones(6, dtype=np.uint8), np.ones((4, 4))[:, 1], np.ones(6).view()]
    cases[2].flags.writeable = False
    for bad in cases:
        buf = bad if RANK == 0 else np.ones(6)
        ok, fails = _raises_everywhere(lambda: allreduce(buf), own=lambda rank: rank == 0)
        _all_ranks(ok, fails)
    _all_ranks(_still_works())


@pytest.mark.mpi(min_size=2)
def test_different_fused_layouts_raise_on_every_rank():
    shapes = [(6,), (4,)] if RANK == 0 else [(4,), (6,)]   # same total, other layout
    tensors = [torch.ones(shape) for shape in shapes]
    ok, fails = _raises_everywhere(lambda: allreduce_fused(tensors))
    _all_ranks(ok and _still_works(), fails)


# ----- argument errors ----------------------------------------------------------------------

def _message(call):
    try:
        call()
    except UsageError as exc:
        return str(exc)
    return ""


def test_unknown_algo_op_and_dtype_list_the_valid_choices():
    messages = [_message(lambda: allreduce(np.ones(3), algo="allgatherv")),
                _message(lambda: allreduce(np.ones(3), op="xor")),
                _message(lambda: allreduce(np.ones(3, dtype=np.complex64))),
                _message(lambda: allreduce(np.ones(3), algo="tree", servers=2))]
    ok = (all(name in messages[0] for name in ALGORITHMS)
          and all(name in messages[1] for name in OPS)
          and all(name in messages[2] for name in DTYPES)
          and "root" in messages[3])
    _all_ranks(ok and _still_works(), messages if not ok else [])


def test_option_values_out_of_range_are_rejected():
    messages = [_message(lambda: allreduce(np.ones(3), algo="tree", root=SIZE)),
                _message(lambda: allreduce(np.ones(3), algo="ps", root=-1)),
                _message(lambda: allreduce(np.ones(3), algo="ps-sharded", servers=0)),
                _message(lambda: allreduce(np.ones(3), algo="butterfly", switch_bytes=-1)),
                _message(lambda: allreduce(np.ones(3), algo="tree", root=[0]))]
    _all_ranks(all(messages) and f"0 to {SIZE - 1}" in messages[0] and _still_works(),
               messages)


def test_non_contiguous_input_names_the_fix():
    numpy_msg = _message(lambda: allreduce(np.ones((4, 4))[:, 0]))
    torch_msg = _message(lambda: allreduce(torch.ones(4, 4).t()))
    ok = "contiguous" in numpy_msg and "np.ascontiguousarray" in numpy_msg \
        and ".contiguous()" in torch_msg
    _all_ranks(ok and _still_works(), [numpy_msg, torch_msg])


# ----- the private communicator -----------------------------------------------------------------

@pytest.mark.mpi(min_size=2)
def test_pending_user_messages_are_not_matched():
    # Rank 0 leaves a tag-0 message (and one with each algorithm's tag, and the next tag)
    # unreceived on the user's communicator: allreduce runs past them on its own.
    user_tags = [0] + sorted({alg.tag for alg in ALGORITHMS.values()}
                             | {alg.tag + 1 for alg in ALGORITHMS.values()})
    sends = [COMM.Isend(np.array([float(tag)]), dest=1, tag=tag)
             for tag in user_tags] if RANK == 0 else []
    results = [_reduces_correctly(algo, options) for algo in ALGOS
               for options in variants(algo)]
    ok = all(results)
    if RANK == 1:
        for tag in user_tags:
            got = np.zeros(1)
            COMM.Recv(got, source=0, tag=tag)
            ok = ok and got[0] == tag
    MPI.Request.Waitall(sends)
    _all_ranks(ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_a_wildcard_user_receive_is_not_matched():
    # Rank 1 posts a receive from any source with any tag before the allreduces: had any
    # message of ours been sent on the user's communicator, it would complete it (and the
    # allreduce that lost it would wait forever: hence the timeout).
    wildcard = np.zeros(1)
    pending = COMM.Irecv(wildcard, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG) \
        if RANK == 1 else None
    results = [_reduces_correctly(algo, options) for algo in ALGOS
               for options in variants(algo)]
    untouched = pending.Test() is False if RANK == 1 else True
    COMM.Barrier()
    if RANK == 0:
        COMM.Send(np.array([99.0]), dest=1, tag=4242)   # now complete it ourselves
    status = MPI.Status()
    if RANK == 1:
        pending.Wait(status)
    got_ours = RANK != 1 or (wildcard[0] == 99.0 and status.Get_tag() == 4242)
    _all_ranks(all(results) and untouched and got_ours,
               [] if untouched else ["the wildcard receive matched an allreduce message"])


def _reduces_correctly(algo, options):
    buf = np.full(SIZE * 3 + 1, RANK + 1.0)
    allreduce(buf, algo=algo, **options)
    return bool((buf == SIZE * (SIZE + 1) / 2).all())


def test_the_private_communicator_is_duplicated_once():
    ctx = context(COMM)
    ok = ctx is context(COMM) is context(None) and ctx.comm != COMM \
        and MPI.Comm.Compare(ctx.comm, COMM) == MPI.CONGRUENT
    _all_ranks(ok)


def test_a_sub_communicator_works_and_is_released_with_it():
    sub = COMM.Split(RANK % 2, RANK)
    buf = np.full(5, RANK, dtype=np.int64)
    allreduce(buf, comm=sub, algo="ring")
    members = range(RANK % 2, SIZE, 2)
    ok = (buf == sum(members)).all() and context(sub) is context(sub)
    dup = context(sub).comm
    sub.Free()                          # frees our duplicate with it (attribute callback)
    _all_ranks(ok and dup == MPI.COMM_NULL)


def test_hierarchical_sub_communicators_are_made_once_and_freed_with_the_context():
    sub = COMM.Dup()
    failures = []
    for per_node in (1, 2, 3):
        for count in (SIZE + 1, 1009):
            buf = np.full(count, RANK + 1, dtype=np.int64)
            allreduce(buf, comm=sub, algo="hierarchical", ranks_per_node=per_node)
            if not (buf == SIZE * (SIZE + 1) // 2).all():
                failures.append(f"ranks_per_node={per_node} n={count}: {buf[:3]}")
    ctx = context(sub)
    groups = [state for (name, _), state in ctx.setups.items() if name == "hierarchical"]
    if SIZE > 1 and len(groups) != len({min(k, SIZE) for k in (1, 2, 3)}):
        failures.append(f"{len(groups)} set-ups for {len(ctx.setups)} keys")
    comms = [c for g in groups for c in (g.local, *g.inter.values())]
    sub.Free()                          # frees the context, and with it the set-ups
    if any(c != MPI.COMM_NULL for c in comms) or ctx.setups:
        failures.append("sub-communicators outlived the context")
    _all_ranks(not failures, failures)


def test_hierarchical_groups_by_shared_memory_node_without_the_option(monkeypatch):
    # One machine: every rank shares a node, so the set-up finds one node of SIZE ranks.
    monkeypatch.delenv("HPCTRAIN_RANKS_PER_NODE", raising=False)
    sub = COMM.Dup()
    buf = np.full(7, RANK, dtype=np.int64)
    allreduce(buf, comm=sub, algo="hierarchical")
    (state,) = context(sub).setups.values() if SIZE > 1 else (None,)
    ok = (buf == SIZE * (SIZE - 1) // 2).all() and \
        (state is None or state.layout.nodes == (0,) * SIZE)
    sub.Free()
    _all_ranks(bool(ok))


def test_hierarchical_takes_its_node_size_from_the_environment(monkeypatch):
    monkeypatch.setenv("HPCTRAIN_RANKS_PER_NODE", "1")
    assert ALGORITHMS["hierarchical"].parameters(SIZE, {})[0] == 1
    monkeypatch.setenv("HPCTRAIN_RANKS_PER_NODE", "two")
    with pytest.raises(UsageError, match="HPCTRAIN_RANKS_PER_NODE='two' is not an integer"):
        ALGORITHMS["hierarchical"].parameters(SIZE, {})


def test_workspaces_are_reused_without_per_call_allocations():
    # A warm call allocates nothing of the message's size: the receive workspace is kept
    # per (communicator, dtype) and the plan (schedule, slices' bounds) per call shape.
    count = BIG_BYTES // 8
    failures = []
    for algo in OURS:
        # Segments of a few bytes cost a request each, by design: only the usual sizes here.
        for options in (o for o in variants(algo) if not 0 < o.get("segment_bytes", 0) < 4096):
            buf = np.ones(count)
            allreduce(buf, algo=algo, **options)
            tracemalloc.start()
            allreduce(buf, algo=algo, **options)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            if peak > 64 * 1024:
                failures.append(f"{algo} {options}: {peak} bytes allocated")
    _all_ranks(not failures, failures)


# ----- fused ---------------------------------------------------------------------------------

def test_fused_reduces_every_tensor_through_one_reused_buffer():
    shapes = [(3, 4), (5,), (), (2, 3, 2)]
    tensors = [torch.full(shape, float(RANK + i)) for i, shape in enumerate(shapes)]
    tensors[0] = tensors[0].t()                     # non-contiguous is fine: it is copied
    out = allreduce_fused(tensors, op="avg", algo="butterfly")
    buffer = next(b for k, b in context().fused.items() if "torch.float32" in k)
    allreduce_fused(tensors, op="sum")
    again = next(b for k, b in context().fused.items() if "torch.float32" in k)
    want = [(SIZE - 1) / 2 + i for i in range(len(shapes))]
    ok = out is not None and all(t is o for t, o in zip(tensors, out)) and buffer is again
    ok = ok and all(torch.equal(t, torch.full(t.shape, w * SIZE)) for t, w in zip(tensors, want))
    _all_ranks(ok)


def test_fused_numpy_arrays_and_errors():
    arrays = [np.full((2, 2), RANK, dtype=np.int32), np.full(3, 1, dtype=np.int32)]
    allreduce_fused(arrays, op="sum", algo="ring")
    ok = (arrays[0] == SIZE * (SIZE - 1) // 2).all() and (arrays[1] == SIZE).all()
    mixed = _message(lambda: allreduce_fused([np.ones(2), np.ones(2, dtype=np.float32)]))
    ok = ok and "one dtype" in mixed and allreduce_fused([]) == []
    _all_ranks(ok, [mixed])


# ----- Horovod, last -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def horovod():
    """Horovod's algorithm, stopped again after this module's last test that used it."""
    if not HOROVOD:
        pytest.skip("Horovod is not installed here")
    yield "horovod"
    from hpctrain.collectives import horovod as module

    module.shutdown()


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_horovod_matches_the_reference(horovod, dtype):
    # Few sizes: every call waits for Horovod's next cycle (~1 ms).
    failures = [f for op in sorted(OPS) for count in (0, 1, SIZE + 1, 1009)
                if (f := run_case(horovod, dtype, op, count, {}, salt=count))]
    if dtype == "float32":   # and once a megabyte, from a torch tensor
        big = run_case(horovod, dtype, "sum", BIG_BYTES // 4 + 3, {}, salt=6, kind="torch")
        failures += [big] if big else []
    _all_ranks(not failures, failures)
