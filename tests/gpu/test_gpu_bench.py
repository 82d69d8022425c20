"""``bench allreduce --device cuda`` through the bench API, under mpirun: a row per size and
algorithm with a positive bandwidth and no wrong value, on each rank's own GPU."""

import json

import torch

from gpu_support import COMM, GPU_MODULE, SIZE, all_ranks
from hpctrain import collectives
from hpctrain.bench import allreduce as bench
from hpctrain.cli import build_parser
from hpctrain.devices import node_local_rank

pytestmark = GPU_MODULE

ALGOS = ["ring", "tree", "butterfly", "ps", "ps-sharded", "mpi"]


def bench_args(*extra):
    return build_parser().parse_args(["bench", "allreduce", "--device", "cuda", "--algos",
                                      ",".join(ALGOS), "-n", "3", "-w", "1", *extra])


def test_bench_on_cuda_reports_bandwidth_and_no_wrong_value(tmp_path):
    out = COMM.bcast(str(tmp_path / "bench.json"), root=0)
    wrong = bench.run(bench_args("-b", "8", "-e", "4M", "-f", "8", "--json", out), COMM)
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
    wrong = bench.run(bench_args("-b", "64K", "-e", "64K"), COMM)
    local = node_local_rank(COMM)
    want = torch.device("cuda", local % torch.cuda.device_count())
    all_ranks(devices == {want} and wrong == 0,
              [f"local rank {local}: buffers on {sorted(map(str, devices))}, want {want}"])
