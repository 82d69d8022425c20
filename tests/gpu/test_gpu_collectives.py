"""Allreduce and broadcast of CUDA tensors. Run under mpirun:
``python -m hpctrain.launch -np 2 python -m pytest --with-mpi tests/gpu``.

Every algorithm, dtype, op and odd size on CUDA tensors must give, bit for bit, what the
same call gives on CPU tensors: the data are small integers whose sums are exact in any
order and in every dtype. Both CUDA paths are run on every machine with a GPU:

- ``direct``: device memory straight to a CUDA-aware MPI (skipped, with the detection's
  answer, where MPI is not CUDA-aware);
- ``staged``: through the reused page-locked host buffer, forced on a fresh communicator
  whose context is told that MPI is not CUDA-aware, so it runs even where MPI is.

Horovod has its own module (test_gpu_horovod.py). Every final assertion is collective.
"""

import numpy as np
import pytest
import torch

from gpu_support import COMM, GPU_MODULE, RANK, SIZE, all_ranks
from gpu_support import device  # noqa: F401 - fixture
from hpctrain.mpi import cuda as mpi_cuda
from hpctrain.collectives import (ALGORITHMS, DTYPES, OPS, REGISTRIES, allreduce,
                                  allreduce_fused, broadcast)
from hpctrain.collectives import buffers, driver
from hpctrain.collectives import context
from hpctrain.errors import UsageError

pytestmark = GPU_MODULE

ALGOS = sorted(set(ALGORITHMS) - {"horovod"})
BIG_BYTES = 1 << 20


@pytest.fixture(params=["direct", "staged"])
def path(request, monkeypatch):
    """``(name, comm)``: a fresh duplicate of COMM_WORLD on which CUDA tensors take the
    ``direct`` path (at every size: ``HPCTRAIN_CUDA_DIRECT_BYTES=0``) or the ``staged`` one
    (a fresh one: a context asks once and keeps the answer)."""
    monkeypatch.setenv(buffers.DIRECT_ENV, "0")
    if request.param == "staged":
        monkeypatch.setattr(mpi_cuda, "cuda_awareness", lambda comm=None: mpi_cuda.
                            CudaAwareness(False, "test: staged path forced"))
    else:
        awareness = mpi_cuda.cuda_awareness(COMM)
        if awareness.aware is not True:
            pytest.skip(f"MPI is not CUDA-aware here ({awareness}): the direct path cannot "
                        f"run; the staged one is tested")
    comm = COMM.Dup()
    yield request.param, comm
    comm.Free()     # frees the context cached on it, workspaces included


def variants(algo):
    """The option settings worth testing for ``algo``: the algorithm's own examples."""
    return ALGORITHMS[algo].examples(SIZE)


def contribution(rank, count, salt):
    """Integers in [-8, 8]: any sum over 4 ranks is exact in every dtype, bfloat16 included."""
    return (np.arange(count, dtype=np.int64) * 7 + rank * 13 + salt) % 17 - 8


def expect_staged(path_name, algo, dtype):
    """The path a call must take: staged when forced, and for the MPI library's allreduce
    of half precision (its reduction is a Python callback, which cannot read the device)."""
    return path_name == "staged" or (algo == "mpi" and DTYPES[dtype].half)


def run_case(path, device, algo, dtype, op, count, options, salt):
    """One CUDA allreduce and the same call on CPU; what went wrong, or None."""
    path_name, comm = path
    cpu = torch.tensor(contribution(RANK, count, salt), dtype=getattr(torch, dtype))
    gpu = cpu.to(device)
    allreduce(cpu, op=op, algo=algo, comm=comm, **options)
    out = allreduce(gpu, op=op, algo=algo, comm=comm, **options)
    what = f"{path_name} {algo} {dtype} {op} n={count} {options}"
    _, plan = driver.resolve(context(comm), gpu, op, algo, options)   # the cached plan
    if plan.staged != expect_staged(path_name, algo, dtype):
        return f"{what}: took the {'staged' if plan.staged else 'direct'} path"
    if out is not gpu or gpu.device != device:
        return f"{what}: did not reduce the tensor in place on {device}"
    got = gpu.cpu()
    if not torch.equal(got, cpu):
        wrong = torch.nonzero(got != cpu).reshape(-1)
        first = int(wrong[0])
        return (f"{what}: {len(wrong)} differ from CPU, first at {first}: "
                f"got {got[first].item()}, CPU {cpu[first].item()}")
    return None


def test_the_path_fixture_sets_the_context(path):
    name, comm = path
    all_ranks(context(comm).cuda_aware is (name == "direct"))


# ----- every algorithm x dtype x op x size x options ------------------------------------------

@pytest.mark.parametrize("algo", ALGOS)
def test_every_dtype_op_and_size_matches_the_cpu_result(path, device, algo):
    sizes = sorted({0, 1, max(SIZE - 1, 0), SIZE, SIZE + 1, 1009})
    failures = [f for dtype in sorted(DTYPES) for op in sorted(OPS) for count in sizes
                for options in variants(algo)
                if (f := run_case(path, device, algo, dtype, op, count, options, salt=count))]
    all_ranks(not failures, failures)


@pytest.mark.parametrize("algo", ["ring", "tree", "mpi"])
def test_by_default_small_messages_are_staged_and_large_ones_direct(device, algo, monkeypatch):
    monkeypatch.delenv(buffers.DIRECT_ENV, raising=False)
    awareness = mpi_cuda.cuda_awareness(COMM)
    if awareness.aware is not True:
        pytest.skip(f"MPI is not CUDA-aware here ({awareness}): everything is staged")
    comm = COMM.Dup()
    try:
        failures = []
        for count in (1, 4096, buffers.DIRECT_BYTES // 4 - 1, buffers.DIRECT_BYTES // 4,
                      buffers.DIRECT_BYTES // 4 + 1009):
            # expect_staged says staged for the "staged" path only: the threshold is the
            # path's name here.
            name = "staged" if count * 4 < buffers.DIRECT_BYTES else "direct"
            failures.append(run_case((name, comm), device, algo, "float32", "sum", count, {},
                                     salt=count))
        failures = [f for f in failures if f]
    finally:
        comm.Free()
    all_ranks(not failures, failures)


@pytest.mark.parametrize("dtype", ["float32", "int64", "bfloat16", "float16"])
@pytest.mark.parametrize("algo", ALGOS)
def test_a_megabyte_and_more_matches_the_cpu_result(path, device, algo, dtype):
    count = BIG_BYTES // DTYPES[dtype].itemsize + 3     # + 3: not a multiple of p
    ops = ["sum"] if DTYPES[dtype].half else ["sum", "avg", "max"]
    failures = [f for op in ops for options in variants(algo)
                if (f := run_case(path, device, algo, dtype, op, count, options, salt=5))]
    all_ranks(not failures, failures)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algo", ["ring", "butterfly", "mpi"])
def test_a_tensor_written_just_before_the_call_is_read_after_the_write(path, device, algo):
    # The kernel that writes the tensor is queued behind a long one and has not run when
    # allreduce is called. The direct path must synchronise the stream before MPI reads
    # device memory, or it reduces the zeros that were there before.
    _, comm = path
    count = 4 << 20
    tensor = torch.zeros(count, device=device)
    torch.cuda.synchronize(device)
    torch.cuda._sleep(200_000_000)          # ~0.1 s of GPU time on the current stream
    tensor.fill_(RANK + 1)
    allreduce(tensor, algo=algo, comm=comm)
    want = SIZE * (SIZE + 1) / 2
    wrong = int((tensor != want).sum())
    all_ranks(wrong == 0, [f"{algo}: {wrong} of {count} elements are not {want}"])


@pytest.mark.parametrize("algo", sorted(REGISTRIES["broadcast"]))
def test_broadcast_of_cuda_tensors_from_every_root(path, device, algo):
    # Bytes move, whatever the dtype; the values are converted on the device just before
    # the call, so the direct path must synchronise the stream before MPI reads them.
    _, comm = path
    failures = []
    for root in range(SIZE):
        for dtype in (torch.bool, torch.bfloat16, torch.float32):
            for count in sorted({1, max(SIZE - 1, 1), 1009, BIG_BYTES // 4 + 3}):
                mine = torch.from_numpy(contribution(RANK, count, root))
                buf = mine.to(device=device, dtype=dtype)
                out = broadcast(buf, root, algo, comm)
                want = torch.from_numpy(contribution(root, count, root)).to(dtype)
                if out is not buf or not torch.equal(buf.cpu(), want):
                    failures.append(f"{algo} {dtype} {count} from root {root}")
    all_ranks(not failures, failures)


# ----- buffers ----------------------------------------------------------------------------------

@pytest.fixture
def pinned_allocations(monkeypatch):
    """A list that gets the size of every page-locked ``torch.empty`` from now on."""
    sizes, empty = [], torch.empty

    def counting_empty(*args, **kwargs):
        if kwargs.get("pin_memory"):
            sizes.append(args[0] if args else kwargs.get("size"))
        return empty(*args, **kwargs)
    monkeypatch.setattr(torch, "empty", counting_empty)
    return sizes


@pytest.mark.mpi(min_size=2)
def test_the_staged_path_reuses_one_pinned_buffer(path, device, pinned_allocations):
    name, comm = path
    if name != "staged":
        pytest.skip("the pinned buffer belongs to the staged path")
    ctx, float32 = context(comm), DTYPES["float32"]
    count = 1 << 20
    failures = []

    def reduce_and_check(n, label):
        tensor = torch.full((n,), float(RANK + 1), device=device)
        allreduce(tensor, algo="ring", comm=comm)
        if not bool((tensor == SIZE * (SIZE + 1) / 2).all()):
            failures.append(f"{label}: wrong sum")

    reduce_and_check(count, "first call")
    first = buffers.pinned(ctx, float32, count)
    allocated = len(pinned_allocations)
    for n in (count, count, count // 3, 1, count):      # same size and smaller: no allocation
        reduce_and_check(n, f"warm call n={n}")
    again = buffers.pinned(ctx, float32, count)
    if allocated != 1:
        failures.append(f"the first call made {allocated} pinned allocations, not 1")
    if len(pinned_allocations) != allocated:
        failures.append(f"warm calls allocated pinned memory: {pinned_allocations[allocated:]}")
    if not (first.is_pinned() and again.data_ptr() == first.data_ptr()):
        failures.append("the pinned buffer is not page-locked, or was replaced")
    reduce_and_check(2 * count, "larger")                # grows once, then is reused
    reduce_and_check(2 * count, "larger again")
    grown = len(pinned_allocations) - allocated
    if grown != 1:
        failures.append(f"growing to {2 * count} elements allocated {grown} times, not once")
    all_ranks(not failures, failures)


@pytest.mark.mpi(min_size=2)
def test_the_direct_path_stages_nothing(path, device, pinned_allocations):
    name, comm = path
    if name != "direct":
        pytest.skip("the direct path is the one that must not stage")
    tensor = torch.full((1 << 20,), float(RANK + 1), device=device)
    for algo in ALGOS:
        allreduce(tensor.fill_(RANK + 1), algo=algo, comm=comm)
    ok = not pinned_allocations and bool((tensor == SIZE * (SIZE + 1) / 2).all())
    all_ranks(ok, [f"pinned allocations: {pinned_allocations}"] if pinned_allocations else [])


# ----- fused --------------------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["ring", "tree", "butterfly", "mpi"])
def test_fused_cuda_tensors_match_the_cpu_result_through_one_reused_buffer(path, device, algo):
    _, comm = path
    shapes = [(3, 4), (5,), (), (2, 3, 2)]
    failures = []
    for op in ("avg", "sum", "max"):
        cpu = [torch.tensor(contribution(RANK, int(np.prod(s)), salt=i).reshape(s),
                            dtype=torch.float32) for i, s in enumerate(shapes)]
        cpu[0] = cpu[0].t()                 # non-contiguous: copied into the fused buffer
        gpu = [t.to(device) for t in cpu]
        allreduce_fused(cpu, op=op, algo=algo, comm=comm)
        out = allreduce_fused(gpu, op=op, algo=algo, comm=comm)
        if out is None or any(o is not g for o, g in zip(out, gpu)):
            failures.append(f"{op}: did not return the tensors it was given")
        if not all(torch.equal(g.cpu(), c) for g, c in zip(gpu, cpu)):
            failures.append(f"{op}: differs from the CPU result")
    buffers = [b for k, b in context(comm).fused.items() if "cuda" in str(k)]
    again = allreduce_fused(gpu, op="sum", algo=algo, comm=comm)
    reused = [b for k, b in context(comm).fused.items() if "cuda" in str(k)]
    if len(buffers) != 1 or buffers[0].device != device or reused[0] is not buffers[0]:
        failures.append(f"the fused buffer is not one reused device buffer: {buffers}")
    all_ranks(not failures and again is not None, failures)


def test_fused_refuses_cpu_and_cuda_tensors_together(device):
    try:
        allreduce_fused([torch.ones(3), torch.ones(3, device=device)])
        message = ""
    except UsageError as exc:
        message = str(exc)
    still = torch.full((5,), float(RANK), device=device)
    allreduce(still)                         # every rank raised: none is left waiting
    ok = "one device" in message and bool((still == SIZE * (SIZE - 1) / 2).all())
    all_ranks(ok, [message])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_adasum_of_cuda_tensors_equals_adasum_of_their_cpu_copies(path, device, dtype):
    """Adasum's dot products run on the host: device memory is staged, whatever the MPI."""
    if SIZE & (SIZE - 1):
        pytest.skip(f"Adasum needs a power of two of ranks, not {SIZE}")
    from hpctrain.collectives.adasum import adasum_allreduce

    _, comm = path
    failures = []
    for count in (0, 1, 1009):
        cpu = torch.tensor(contribution(RANK, count, salt=count), dtype=getattr(torch, dtype))
        gpu = cpu.to(device)
        adasum_allreduce(cpu, comm=comm)
        out = adasum_allreduce(gpu, comm=comm)
        if out is not gpu or gpu.device != device or not torch.equal(gpu.cpu(), cpu):
            failures.append(f"{dtype} n={count}: differs from the CPU's Adasum")
    all_ranks(not failures, failures)
