"""``bench allreduce --device cuda`` through the bench API, under mpirun: a row per size and
algorithm with a positive bandwidth and no wrong value, on each rank's own GPU; its Sendrecv
reference staged through host memory where MPI is not CUDA-aware (handing device memory to
such an MPI is a segmentation fault), and direct where it is."""

import json

import torch

from gpu_support import COMM, GPU_MODULE, SIZE, all_ranks
from gpu_support import device  # noqa: F401 - fixture
from hpctrain import collectives
from hpctrain.bench import allreduce as bench
from hpctrain.bench import driver
from hpctrain.cli import build_parser
from hpctrain.devices import node_local_rank
from hpctrain.mpi.cuda import CudaAwareness, cuda_awareness

pytestmark = GPU_MODULE

# Every algorithm of the registry but Horovod, whose GPU build and launch have tests of their own.
ALGOS = [name for name in collectives.ALGORITHMS if name != "horovod"]


def bench_args(*extra):
    return build_parser().parse_args(["bench", "allreduce", "--device", "cuda", "--algos",
                                      ",".join(ALGOS), "-n", "3", "-w", "1", *extra])


def test_bench_on_cuda_reports_bandwidth_and_no_wrong_value(tmp_path):
    out = COMM.bcast(str(tmp_path / "bench.json"), root=0)
    wrong = driver.run("allreduce", bench_args("-b", "8", "-e", "4M", "-f", "8", "--json", out),
                       COMM)
    failures = [] if wrong == 0 else [f"{wrong} wrong values"]
    if COMM.rank == 0:
        document = json.load(open(out))
        rows = document["rows"]
        sizes = [8 << (3 * k) for k in range(7)]          # 8 B, 64 B, ..., 2 MiB
        if [(r["size"], r["algo"]) for r in rows] != [(s, a) for s in sizes for a in ALGOS]:
            failures.append(f"rows: {[(r['size'], r['algo']) for r in rows]}")
        # busbw = algbw * 2(p-1)/p: zero by definition on one rank.
        column = "busbw_GBps" if SIZE > 1 else "algbw_GBps"
        failures += [f"{r['size']} {r['algo']}: {column} {r[column]}, wrong {r['wrong']}"
                     for r in rows if not (r[column] > 0 and r["wrong"] == 0)]
        if document["settings"]["device"] != "cuda":
            failures.append(f"settings: {document['settings']}")
    all_ranks(not failures, failures)


def test_bench_puts_each_rank_buffers_on_its_local_rank_gpu(monkeypatch):
    devices, reduce = set(), collectives.allreduce

    def recording_allreduce(buf, *args, **kwargs):
        devices.add(buf.device)
        return reduce(buf, *args, **kwargs)
    monkeypatch.setattr(collectives, "allreduce", recording_allreduce)
    wrong = driver.run("allreduce", bench_args("-b", "64K", "-e", "64K"), COMM)
    local = node_local_rank(COMM)
    want = torch.device("cuda", local % torch.cuda.device_count())
    all_ranks(devices == {want} and wrong == 0,
              [f"local rank {local}: buffers on {sorted(map(str, devices))}, want {want}"])


def test_bench_on_cuda_stages_the_sendrecv_reference_where_mpi_is_not_cuda_aware(monkeypatch,
                                                                                 tmp_path):
    # Told "not CUDA-aware" (true of most MPIs; forced here so that a CUDA-aware one runs it
    # too), the reference must never give device memory to mpi4py.
    told = CudaAwareness(False, "told so by the test")
    monkeypatch.setattr(bench.mpi_cuda, "cuda_awareness", lambda comm=None: told)
    out = COMM.bcast(str(tmp_path / "staged.json"), root=0)
    wrong = driver.run("allreduce", bench_args("-b", "8", "-e", "64", "--json", out), COMM)
    failures = [] if wrong == 0 else [f"{wrong} wrong values"]
    if COMM.rank == 0:
        reference = json.load(open(out))["sendrecv_reference"]
        if reference["path"] != "staged" or not reference["time_median_us"] > 0:
            failures.append(f"reference: {reference}")
    all_ranks(not failures, failures)


def test_the_staged_sendrecv_swaps_device_buffers_between_rank_pairs(device):
    peer = COMM.rank ^ 1 if COMM.rank ^ 1 < SIZE else COMM.rank
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        buf = torch.full((1000,), COMM.rank + 1, dtype=dtype, device=device)
        for path in ("staged", "direct") if cuda_awareness(COMM).aware is True else ("staged",):
            call = bench.sendrecv_call(buf, COMM, path)
            call()
            torch.cuda.synchronize(device)
            got = call.received.view(dtype)
            ok = got.is_cuda and bool((got == peer + 1).all())
            all_ranks(ok, [f"{path} {dtype}: got {got[:4].tolist()}, want {peer + 1}"])
