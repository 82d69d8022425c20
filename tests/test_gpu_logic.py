"""The GPU support's logic, tested where there is no GPU (CI, this machine): the local rank ->
GPU mapping, CUDA-awareness detection, the choice between the direct and the staged path
and the staged path's data flow, and the errors that ``--device cuda`` gives without CUDA
on every rank. The GPU itself is tested in tests/gpu (scripts/gpu-check)."""

import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hpctrain import info
from hpctrain.mpi import cuda as mpi_cuda
from hpctrain.collectives import ALGORITHMS, DTYPES, buffers, context
from hpctrain.errors import UsageError
from hpctrain.mpi.cuda import CudaAwareness
from hpctrain.train import TrainConfig
from hpctrain.train.build import device as _device

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}     # torch sees no GPU, even on a GPU machine
REPO = Path(__file__).resolve().parents[1]
PYTHON_ALGOS = sorted(set(ALGORITHMS) - {"horovod"})


# ----- local rank -> GPU -----------------------------------------------------------------

class FakeComm:
    """A communicator whose node-local split gives ``local_rank``."""

    def __init__(self, local_rank):
        self.local_rank, self.splits = local_rank, 0

    def Get_rank(self):
        return 7

    def Split_type(self, split_type, key):
        self.splits += 1
        return SimpleNamespace(Get_rank=lambda: self.local_rank,
                               Get_size=lambda: self.local_rank + 1, Free=lambda: None)


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n)``: torch sees ``n`` GPUs; returns the list that ``set_device`` calls fill."""
    chosen = []

    def fake(count):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"GPU{index}")
        return chosen
    return fake


@pytest.mark.parametrize("local_rank, count, index", [(0, 1, 0), (1, 1, 0), (3, 1, 0),
                                                      (1, 2, 1), (2, 2, 0), (5, 4, 1),
                                                      (3, 8, 3)])
def test_each_rank_gets_its_local_rank_modulo_the_gpu_count(gpus, local_rank, count, index):
    chosen = gpus(count)
    device = _device(TrainConfig(device="cuda"), FakeComm(local_rank))
    assert device == torch.device("cuda", index)
    assert chosen == [device], "the GPU is made current, so that unplaced tensors land on it"
    assert info.gpu_for(local_rank) == f"cuda:{index} GPU{index}", "info shows the same GPU"


def test_cpu_training_asks_no_gpu_and_makes_no_split(gpus):
    chosen, comm = gpus(2), FakeComm(1)
    assert _device(TrainConfig(device="cpu"), comm) == torch.device("cpu")
    assert chosen == [] and comm.splits == 0


def test_info_shows_no_gpu_without_cuda(gpus):
    gpus(0)
    assert info.gpu_for(0) == "-"


# ----- CUDA-awareness detection ------------------------------------------------------------

def fake_ompi_info(tmp_path, monkeypatch, *lines):
    """Put an ``ompi_info`` that prints ``lines`` first on PATH."""
    exe = tmp_path / "ompi_info"
    exe.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in lines))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))


@pytest.mark.parametrize("value, aware", [("true", True), ("false", False)])
def test_ompi_info_answers_from_the_built_with_cuda_line(tmp_path, monkeypatch, value, aware):
    fake_ompi_info(tmp_path, monkeypatch,
                   "mca:opal:base:param:opal_built_with_cuda_support:value:false",
                   f"mca:mpi:base:param:mpi_built_with_cuda_support:value:{value}",
                   "mca:mpi:base:param:mpi_built_with_cuda_support:source:default")
    answer = mpi_cuda._from_ompi_info(None)
    assert answer.aware is aware
    assert answer.method == ("ompi_info: mca:mpi:base:param:mpi_built_with_cuda_support:value:"
                             + value)


def test_ompi_info_without_the_line_or_missing_gives_no_answer(tmp_path, monkeypatch):
    fake_ompi_info(tmp_path, monkeypatch, "package:Open MPI")
    assert mpi_cuda._from_ompi_info(None) is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert mpi_cuda._from_ompi_info(None) is None


class InfoComm:
    """A communicator whose info object holds ``mpi_memory_alloc_kinds`` (or not)."""

    def __init__(self, kinds):
        self.kinds, self.freed = kinds, 0

    def Get_info(self):
        get = {"mpi_memory_alloc_kinds": self.kinds}.get
        return SimpleNamespace(Get=get, Free=self._free)

    def _free(self):
        self.freed += 1


@pytest.mark.parametrize("kinds, aware", [("mpi,system,cuda:device,cuda:host", True),
                                          ("mpi,system", False), (None, None)])
def test_the_mpi_4_1_alloc_kinds_key(kinds, aware):
    comm = InfoComm(kinds)
    answer = mpi_cuda._from_alloc_kinds(comm)
    assert comm.freed == 1, "the info object is freed"
    if aware is None:
        assert answer is None
    else:
        assert answer == CudaAwareness(aware, f"mpi_memory_alloc_kinds={kinds}")


def test_the_mpix_query_is_asked_of_open_mpi_only(monkeypatch):
    monkeypatch.setattr(mpi_cuda, "library_version", lambda: "MPICH Version: 4.1.2")
    assert mpi_cuda._from_mpix_query(None) is None


@pytest.mark.parametrize("answers, expected", [
    ((True, False, False), CudaAwareness(True, "alloc kinds")),
    ((None, False, True), CudaAwareness(False, "MPIX")),
    ((None, None, True), CudaAwareness(True, "ompi_info")),
])
def test_the_first_method_that_answers_decides(monkeypatch, answers, expected):
    names = ("alloc kinds", "MPIX", "ompi_info")
    for probe, answer, name in zip(("_from_alloc_kinds", "_from_mpix_query", "_from_ompi_info"),
                                   answers, names):
        monkeypatch.setattr(mpi_cuda, probe, lambda comm, answer=answer, name=name:
                            None if answer is None else CudaAwareness(answer, name))
    assert mpi_cuda.cuda_awareness() == expected


def test_no_method_is_unknown_and_says_so(monkeypatch):
    for probe in ("_from_alloc_kinds", "_from_mpix_query", "_from_ompi_info"):
        monkeypatch.setattr(mpi_cuda, probe, lambda comm: None)
    answer = mpi_cuda.cuda_awareness()
    assert answer.aware is None and str(answer).startswith("unknown (no method available")


def test_info_prints_the_answer_with_its_method():
    # What `hpctrain info` shows in its "MPI CUDA support" row.
    assert str(CudaAwareness(True, "MPIX_Query_cuda_support()")) == \
        "yes (MPIX_Query_cuda_support())"
    assert str(CudaAwareness(False, "mpi_memory_alloc_kinds=mpi,system")) == \
        "no (mpi_memory_alloc_kinds=mpi,system)"


# ----- direct or staged -------------------------------------------------------------------

@pytest.fixture
def self_context(monkeypatch):
    """``self_context(aware)``: an allreduce context on a duplicate of COMM_SELF whose MPI
    answers ``aware`` to the CUDA-awareness question."""
    from mpi4py import MPI

    comms = []

    def make(aware):
        monkeypatch.setattr(mpi_cuda, "cuda_awareness",
                            lambda comm=None: CudaAwareness(aware, "test"))
        comms.append(MPI.COMM_SELF.Dup())
        return context(comms[-1])
    yield make
    for comm in comms:
        comm.Free()


@pytest.mark.parametrize("aware", [False, None])
def test_cuda_data_is_staged_unless_mpi_is_known_to_be_cuda_aware(self_context, aware):
    # "unknown" must stage: handing device memory to an MPI that cannot read it crashes.
    ctx = self_context(aware)
    assert ctx.cuda_aware is False
    for algo in PYTHON_ALGOS:
        for dtype in DTYPES.values():
            plan = ctx.plan(("test", algo, dtype.name), algo, "avg", dtype, 10, {}, 0)
            assert plan.staged, (algo, dtype.name)
            assert plan.scratch is None or not isinstance(plan.scratch, torch.Tensor)


def test_which_algorithms_may_be_handed_device_memory():
    for algo in PYTHON_ALGOS:
        for dtype in DTYPES.values():
            capable = ALGORITHMS[algo].device_capable(dtype, True)
            # The MPI library's half-precision reduction is a Python callback on host bytes.
            assert capable is not (algo == "mpi" and dtype.half), (algo, dtype.name)
            assert not ALGORITHMS[algo].device_capable(dtype, False)
            assert not ALGORITHMS[algo].device_capable(dtype, None)
    # Horovod moves device memory itself (NCCL, or its own CUDA-aware MPI path).
    assert ALGORITHMS["horovod"].device_capable(DTYPES["float32"], False)



@pytest.mark.parametrize("setting, expect_from", [(None, buffers.DIRECT_BYTES), ("0", 0),
                                                  ("4096", 4096)])
def test_small_cuda_messages_are_staged_even_where_mpi_is_cuda_aware(
        self_context, monkeypatch, setting, expect_from):
    if setting is None:
        monkeypatch.delenv(buffers.DIRECT_ENV, raising=False)
    else:
        monkeypatch.setenv(buffers.DIRECT_ENV, setting)
    ctx = self_context(True)
    float32 = DTYPES["float32"]
    for count in sorted({1, 1023, 1024, 1025, max(expect_from // 4 - 1, 1),
                         expect_from // 4 + 1}):
        plan = ctx.plan(("test", "ring", count), "ring", "sum", float32, count, {}, 0)
        assert plan.staged is (count * 4 < expect_from), (count, expect_from)
    # Horovod moves device memory by its own means: never staged by the threshold.
    assert buffers.on_device(ctx, ALGORITHMS["horovod"], float32, 4)
    assert not buffers.on_device(ctx, ALGORITHMS["ring"], float32, 4) or expect_from <= 4


@pytest.mark.parametrize("bad", ["64K", "-1", "lots"])
def test_a_bad_cuda_direct_threshold_names_the_variable(self_context, monkeypatch, bad):
    monkeypatch.setenv(buffers.DIRECT_ENV, bad)
    ctx = self_context(True)
    with pytest.raises(UsageError, match=buffers.DIRECT_ENV + ".*whole number of bytes"):
        ctx.plan(("test", "ring"), "ring", "sum", DTYPES["float32"], 10, {}, 0)

STAGED_PROGRAM = textwrap.dedent("""
    # The staged path's data flow on CPU tensors standing in for device data: copy into the
    # host buffer, reduce there, copy back. Page-locked memory needs CUDA: plain host memory
    # stands in for it, through the same reused workspace.
    import sys
    import numpy as np
    import torch
    from mpi4py import MPI
    from hpctrain.mpi import cuda as mpi_cuda
    from hpctrain.collectives import ALGORITHMS, DTYPES, OPS, allreduce, buffers, context

    mpi_cuda.cuda_awareness = lambda comm=None: mpi_cuda.CudaAwareness(False, "test")
    allocations = []

    def host_pinned(ctx, dtype, count):
        def make(n):
            allocations.append((dtype.transport, n))
            return torch.empty(n, dtype=getattr(torch, dtype.transport))
        return ctx.workspace(("pinned", dtype.transport), count, make)[:count]

    buffers.pinned = host_pinned
    comm = MPI.COMM_WORLD
    size, rank = comm.size, comm.rank
    ctx = context(comm.Dup())
    failures = []
    for algo in sorted(set(ALGORITHMS) - {"horovod"}):
        for name, dtype in sorted(DTYPES.items()):
            for op in sorted(OPS):
                for count in (1009, size + 1, 1, 0):     # largest first: one allocation
                    values = (np.arange(count) * 7 + rank * 13 + count) % 17 - 8
                    want = torch.tensor(values, dtype=getattr(torch, name))
                    staged = want.clone()
                    allreduce(want, op=op, algo=algo)    # the host path, as reference
                    plan = ctx.plan(("staged", algo, op, name, count), algo, op, dtype,
                                    count, {}, 0)
                    flat = staged.view(-1)
                    plan.run(flat.view(torch.int16) if dtype.half else flat)
                    if not plan.staged or not torch.equal(staged, want):
                        failures.append(f"{algo} {name} {op} n={count}")
    transports = sorted(t for t, _ in allocations)
    if size > 1 and transports != sorted({d.transport for d in DTYPES.values()}):
        failures.append(f"host buffers allocated: {allocations}")
    everyone = comm.allgather(failures)
    if rank == 0:
        print("staged failures:", [f for fails in everyone for f in fails][:10])
    sys.exit(1 if any(everyone) else 0)
""")


@pytest.mark.parametrize("np", [2, 3])
def test_the_staged_path_reduces_through_one_reused_host_buffer(mpirun, tmp_path, np):
    program = tmp_path / "staged.py"
    program.write_text(STAGED_PROGRAM)
    result = mpirun(np, [sys.executable, program], timeout=240)
    assert result.returncode == 0, result.output[-3000:]
    assert "staged failures: []" in result.output


# ----- --device cuda without CUDA: every rank stops with the reason -------------------------

def test_train_device_cuda_without_cuda_is_a_usage_error_on_every_rank(mpirun, hpctrain_cmd,
                                                                     tmp_path):
    result = mpirun(2, [*hpctrain_cmd, "train", "--device", "cuda", "--progress=never",
                        f"--run-dir={tmp_path}"], timeout=120, env=NO_GPU)
    assert result.returncode == 2, result.output
    assert "--device cuda: torch " in result.output and "sees no CUDA GPU" in result.output
    assert "Traceback" not in result.output


def test_bench_device_cuda_without_cuda_is_a_usage_error_on_every_rank(mpirun, hpctrain_cmd):
    result = mpirun(2, [*hpctrain_cmd, "bench", "allreduce", "--device", "cuda", "-b", "8",
                        "-e", "8"], timeout=120, env=NO_GPU)
    assert result.returncode == 2, result.output
    assert "--device cuda: torch " in result.output and "sees no CUDA GPU" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("driver", [False, True])
def test_the_gpu_check_script_refuses_to_pretend_without_a_gpu(tmp_path, driver):
    # driver: an nvidia-smi that lists a GPU, so that the check of torch is reached too.
    # CUDA_VISIBLE_DEVICES="" hides the GPUs from torch, on a GPU machine as well.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if driver:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: Fake (UUID: GPU-0)'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check")], capture_output=True,
                            text=True, timeout=120,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "",
                                 "HOME": str(tmp_path)})
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "[gpu-check] no GPU: " in output and "nothing was checked" in output
    reason = "sees no CUDA device" if driver else "nvidia-smi is not installed"
    assert reason in output, output


# ----- the device kernels whose output MPI reads next wait for their stream -----------------
# A CUDA-aware MPI reads device memory without waiting for the kernels queued on it: a kernel
# that writes what MPI sends next must have finished (on an H100 the ring's average, taken of
# its own chunk between its two phases, and the allgathers' copy of their own block were
# sent unfinished). Here the stream is a stand-in that notes each wait and what the data held.

@pytest.fixture
def waits(monkeypatch):
    noted = []
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: SimpleNamespace(
                            synchronize=lambda: noted.append(device)))
    return noted


@pytest.mark.parametrize("dtype, total, want", [("float32", 6.0, 2.0), ("int64", -7, -3),
                                                ("bfloat16", 6.0, 2.0)])
def test_the_average_on_the_device_waits_for_its_division(waits, dtype, total, want):
    from hpctrain.collectives.kernels import averager

    flat = torch.full((5,), total, dtype=DTYPES[dtype].torch)
    averager(DTYPES[dtype], 3, on_device=True)(flat)
    assert flat.tolist() == [want] * 5
    assert waits == [flat.device]


def test_the_average_on_the_host_has_no_stream_to_wait_for(waits):
    import numpy as np

    from hpctrain.collectives.kernels import averager

    flat = np.full(4, 9.0, dtype=np.float32)
    averager(DTYPES["float32"], 3, on_device=False)(flat)
    assert flat.tolist() == [3.0] * 4 and waits == []


class DeviceBlock:
    """Stands in for a CUDA tensor: ``is_cuda`` and a device; notes what is written."""

    is_cuda, device = True, "cuda:0"

    def __init__(self):
        self.written = None

    def __setitem__(self, index, value):
        self.written = value


def test_a_ranks_own_block_placed_on_the_device_is_waited_for(waits):
    from hpctrain.collectives.algorithm import place

    block = DeviceBlock()
    place(block, "mine")
    assert block.written == "mine" and waits == ["cuda:0"]
    host = torch.zeros(3)
    place(host, torch.ones(3))
    assert host.tolist() == [1.0] * 3 and waits == ["cuda:0"]

