"""GPU checks and the bench's Sendrecv staging, tested where there is no GPU: the messages
that replace Horovod's and NCCL's tracebacks (from plain facts), the NCCL version codes,
and the choice and data flow of the bench's Sendrecv reference when MPI is not CUDA-aware
(faked). The GPU itself is tested in tests/gpu (scripts/gpu-check)."""

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain import gpu_checks
from hpctrain.bench import allreduce as bench
from hpctrain.errors import UsageError
from hpctrain.mpi.cuda import CudaAwareness

OPTION = "--device cuda"


# ----- a CUDA device requested where torch sees none ----------------------------------------

def test_a_cpu_build_of_torch_is_named_with_the_gpu_set_up():
    message = gpu_checks.cuda_missing_problem(OPTION, "2.13.0", None, None, 0)
    assert message.startswith("--device cuda: torch 2.13.0 sees no CUDA GPU")
    assert "CPU-only build" in message and "scripts/setup --gpu" in message
    assert "HPCTRAIN_SYSTEM_PACKAGES=1" in message


@pytest.mark.parametrize("visible", ["", "-1"])
def test_gpus_hidden_by_cuda_visible_devices_are_named(visible):
    message = gpu_checks.cuda_missing_problem(OPTION, "2.11.0", "13.0", visible, 0)
    assert f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU" in message


def test_a_cuda_build_without_a_driver_says_to_check_nvidia_smi():
    message = gpu_checks.cuda_missing_problem(OPTION, "2.11.0", "13.0", None, 0)
    assert "built for CUDA 13.0" in message and "nvidia-smi" in message


def test_visible_gpus_are_no_problem():
    assert gpu_checks.cuda_missing_problem(OPTION, "2.11.0", "13.0", "0", 1) is None


def test_check_cuda_visible_raises_a_usage_error_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match="--device cuda: torch .* sees no CUDA GPU"):
        gpu_checks.check_cuda_visible()


# ----- Horovod and CUDA tensors ---------------------------------------------------------------

def test_horovod_without_cuda_says_how_to_rebuild_or_what_else_to_use():
    message = gpu_checks.horovod_cuda_problem(False, 0, True, "--allreduce horovod")
    assert "built without GPU operations" in message
    assert "scripts/build-horovod --gpu nccl" in message and "--allreduce ring" in message


def test_horovod_gpu_over_mpi_needs_a_cuda_aware_mpi():
    for aware in (False, None):
        message = gpu_checks.horovod_cuda_problem(True, 0, aware, "--allreduce horovod")
        assert "HOROVOD_GPU_OPERATIONS=MPI" in message and "scripts/build-cuda-mpi" in message
    assert gpu_checks.horovod_cuda_problem(True, 0, True, "x") is None


def test_horovod_with_nccl_needs_no_cuda_aware_mpi():
    assert gpu_checks.horovod_cuda_problem(True, 22803, False, "x") is None


@pytest.mark.parametrize("code, release", [(22803, (2, 28)), (23000, (2, 30)),
                                           (2804, (2, 8)), (21903, (2, 19))])
def test_nccl_version_codes_are_decoded_in_both_layouts(code, release):
    assert gpu_checks.nccl_release(code) == release


def test_nccl_with_more_ranks_than_gpus_says_one_rank_per_gpu():
    message = gpu_checks.nccl_shared_gpu_problem(22803, 2, 1, "--allreduce horovod")
    assert "2 ranks share 1 GPU on this node" in message and "NCCL 2.28" in message
    assert "one rank per GPU" in message and "--gpu mpi" in message
    assert "--allreduce ring" in message


@pytest.mark.parametrize("nccl, ranks, gpus", [(22803, 2, 2), (22803, 1, 1), (22803, 3, 4),
                                               (0, 4, 1), (23000, 2, 1)])
def test_placements_nccl_accepts_are_no_problem(nccl, ranks, gpus):
    assert gpu_checks.nccl_shared_gpu_problem(nccl, ranks, gpus, "x") is None


class FakeHorovod:
    """``horovod.torch`` as a build with the given GPU support reports itself."""

    def __init__(self, cuda, nccl):
        self.cuda_built, self.nccl_built = (lambda: cuda), (lambda: nccl)


def _fake_horovod(monkeypatch, cuda, nccl, gpus):
    import sys
    import types

    package = types.ModuleType("horovod")
    package.torch = FakeHorovod(cuda, nccl)
    monkeypatch.setitem(sys.modules, "horovod", package)
    monkeypatch.setitem(sys.modules, "horovod.torch", package.torch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)


def test_the_collective_check_reads_horovod_and_the_node(monkeypatch):
    # One rank (COMM_SELF) on a node with no GPU it could share: only the build matters.
    _fake_horovod(monkeypatch, cuda=False, nccl=0, gpus=1)
    with pytest.raises(UsageError, match="built without GPU operations"):
        gpu_checks.check_horovod_cuda(MPI.COMM_SELF)
    _fake_horovod(monkeypatch, cuda=True, nccl=22803, gpus=1)
    assert gpu_checks.horovod_cuda_verdict(MPI.COMM_SELF) is None


def test_the_collective_check_counts_the_ranks_on_the_node(monkeypatch):
    _fake_horovod(monkeypatch, cuda=True, nccl=22803, gpus=1)
    monkeypatch.setattr(gpu_checks, "ranks_on_node", lambda comm: 2)
    reason = gpu_checks.horovod_cuda_verdict(MPI.COMM_SELF, "--algos horovod").line()
    assert reason.startswith("--algos horovod: 2 ranks share 1 GPU")


# ----- the bench's Sendrecv reference: direct or staged -------------------------------------

class FakeCudaTensor:
    is_cuda = True


@pytest.mark.parametrize("aware, path", [(True, "direct"), (False, "staged"), (None, "staged")])
def test_device_memory_goes_to_mpi_only_when_it_is_known_to_be_cuda_aware(aware, path):
    awareness = CudaAwareness(aware, "faked")
    assert bench.sendrecv_path(FakeCudaTensor(), awareness) == path
    assert bench.sendrecv_path(FakeCudaTensor(), None) == "staged"


def test_host_buffers_need_no_decision():
    assert bench.sendrecv_path(torch.zeros(4), CudaAwareness(False, "faked")) == "host"
    assert bench.sendrecv_path(np.zeros(4), None) == "host"


class RecordingComm:
    """One rank that swaps with itself, and records what it hands to ``Sendrecv``."""

    rank, size = 0, 1

    def __init__(self):
        self.sent = []

    def Sendrecv(self, send, dest, sendtag, recv, source, recvtag):
        self.sent.append((type(send), type(recv)))
        MPI.COMM_SELF.Sendrecv(send, dest, sendtag, recv, source, recvtag)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_the_staged_sendrecv_hands_mpi_host_arrays_and_copies_the_result_back(dtype):
    comm = RecordingComm()
    buf = torch.arange(1, 6).to(dtype)
    call = bench.sendrecv_call(buf, comm, "staged")
    call()
    call()
    assert comm.sent == [(np.ndarray, np.ndarray)] * 2, "MPI only ever sees host arrays"
    # Partner is self: what arrives is what was sent (bfloat16 travels as int16 bits).
    sent = torch.as_tensor(bench.collectives.buffers.flatten(buf)[0])
    assert torch.equal(call.received, sent)
    assert call.received is not buf


def test_the_footer_says_when_the_reference_was_staged():
    row = {"size": 8, "algo": "ring", "time_median_us": 20.0}
    reference = {"size": 8, "time_median_us": 10.0}
    assert not any("staged" in line for line in bench.reference_lines([row], reference, 2))
    lines = bench.reference_lines([row], {**reference, "path": "staged"}, 2)
    assert any("staged through host memory" in line and "not known to be CUDA-aware" in line
               for line in lines)


# ----- hpctrain info: where a CUDA-aware MPI comes from ---------------------------------------

def _ranks(gpu):
    return [{"rank": 0, "host": "n0", "pid": 1, "local_rank": 0, "gpu": gpu,
             "versions": {"hpctrain": "0"}}]


def test_info_points_ranks_with_a_gpu_to_a_cuda_aware_mpi():
    from hpctrain.info import format_table

    build = {"error": "not importable"}
    for aware in (False, None):
        table = format_table(_ranks("cuda:0 H100"), "Open MPI", "3.1",
                             CudaAwareness(aware, "faked"), build)
        assert "staged through host memory (scripts/build-cuda-mpi" in table
    for gpu, aware in (("-", False), ("cuda:0 H100", True)):
        table = format_table(_ranks(gpu), "Open MPI", "3.1", CudaAwareness(aware, "f"), build)
        assert "build-cuda-mpi" not in table


# ----- hpctrain info: a CUDA-aware library, a driver, a GPU — told apart ---------------------

def test_device_buffers_need_a_cuda_aware_library_a_driver_and_a_gpu_on_every_rank():
    from hpctrain.mpi.cuda import CudaDriver, device_memory_verdict

    gpu = CudaDriver(True, 1, "CUDA driver API 12.4")
    no_gpu = CudaDriver(True, 0, "CUDA driver API 12.4")
    absent = CudaDriver(False, 0, "libcuda.so.1 not found: no NVIDIA driver")
    aware, unaware = CudaAwareness(True, "f"), CudaAwareness(False, "f")
    assert device_memory_verdict(aware, [gpu, gpu]) == (True, "")
    # The machine: a CUDA-built Open MPI, no driver, no GPU.
    assert device_memory_verdict(aware, [absent, absent]) == (False, "no CUDA driver")
    assert device_memory_verdict(aware, [gpu, no_gpu]) == (False, "no GPU visible on rank(s) [1]")
    assert device_memory_verdict(unaware, [gpu]) == (
        False, "the MPI library is not built CUDA-aware")
    assert device_memory_verdict(CudaAwareness(None, "f"), [gpu]) == (
        None, "whether the MPI library is CUDA-aware is unknown")
    ok, why = device_memory_verdict(unaware, [absent, gpu])
    assert not ok and why == ("the MPI library is not built CUDA-aware; "
                              "no CUDA driver on rank(s) [0]")


def test_info_says_which_of_the_three_is_missing():
    from hpctrain.info import format_table
    from hpctrain.mpi.cuda import CudaDriver

    build = {"error": "not importable"}
    ranks = _ranks("-")
    ranks[0]["driver"] = CudaDriver(False, 0, "libcuda.so.1 not found: no NVIDIA driver")
    table = format_table(ranks, "Open MPI", "3.1", CudaAwareness(True, "faked"), build)
    assert "MPI CUDA support yes (faked)" in table
    assert "CUDA driver      no, libcuda.so.1 not found" in table
    assert "GPUs visible     none" in table
    assert "device buffers   no: no CUDA driver" in table
    ranks[0]["driver"] = CudaDriver(True, 2, "CUDA driver API 12.4")
    table = format_table(ranks, "Open MPI", "3.1", CudaAwareness(True, "faked"), build)
    assert "GPUs visible     2 per rank" in table and "device buffers   yes" in table

