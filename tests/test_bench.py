"""The benchmarks: size parsing and fitting in-process, whole runs under mpirun."""

import argparse
import json
import re
import subprocess
import sys

import h5py
import pytest
import torch

from hpctrain.bench import blocks, driver
from hpctrain.bench.p2p import fit_alpha_beta
from hpctrain.collectives import ALGORITHMS, REGISTRIES
from hpctrain.bench.sizes import format_size, parse_size, size_range
from hpctrain.cli import build_parser
from hpctrain.errors import UsageError

ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+([\w-]+)\s+([\d.]+)\s+([\d.]+)\s+"
                 r"([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)$", re.M)


@pytest.mark.parametrize("text, nbytes", [("8", 8), ("0", 0), ("64K", 65536), ("64KB", 65536),
                                          ("64KiB", 65536), ("16M", 16 << 20), ("1g", 1 << 30)])
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "K", "-8", "1.5M", "12X", "8 M B"])
def test_parse_size_rejects_garbage_with_the_valid_form(text):
    with pytest.raises(UsageError, match="optional K, M or G suffix"):
        parse_size(text)


def test_size_range_like_nccl_tests():
    assert size_range(8, 64, 2) == [8, 16, 32, 64]
    assert size_range(8, 100, 4) == [8, 32]
    assert size_range(0, 0, 2) == [0]
    with pytest.raises(UsageError, match="cannot start at 0 B"):
        size_range(0, 8, 2)
    assert size_range(64, 64, 1) == [64]
    with pytest.raises(UsageError, match="-b > -e"):
        size_range(64, 8, 2)
    with pytest.raises(UsageError, match="factor must be >= 2"):
        size_range(8, 64, 1)


def test_format_size():
    assert [format_size(n) for n in (3, 1024, 3 << 20, 1 << 30)] == \
        ["3 B", "1 KiB", "3 MiB", "1 GiB"]


def test_fit_alpha_beta_recovers_a_line():
    sizes = [1 << k for k in range(0, 24, 2)]
    alpha, beta = 2e-6, 1 / 5e9
    fitted = fit_alpha_beta(sizes, [alpha + beta * n for n in sizes])
    assert fitted == pytest.approx((alpha, beta), rel=1e-6)


def test_bench_allreduce_table_files_and_footer(mpirun, hpctrain_cmd, tmp_path):
    out_json, out_h5 = tmp_path / "ar.json", tmp_path / "ar.h5"
    algos = [a for a in ALGORITHMS if a != "horovod"]   # every one the registry has
    result = mpirun(3, [*hpctrain_cmd, "bench", "allreduce", "--algos", ",".join(algos),
                        "-b", "8", "-e", "64K", "-f", "8", "-n", "3", "-w", "1",
                        "--json", out_json, "--hdf5", out_h5], timeout=180)
    assert result.returncode == 0, result.output
    out = result.output
    assert out.startswith("# hpctrain"), out[:200]
    assert len(re.findall(r"^#  Rank\s+\d+ Pid", out, re.M)) == 3
    rows = ROW.findall(out)
    assert [(int(r[0]), r[4]) for r in rows] == \
        [(size, algo) for size in (8, 64, 512, 4096, 32768) for algo in algos]
    assert all(r[10] == "0" for r in rows)
    assert "# Out of bounds values : 0 OK" in out
    for algo in algos:
        assert re.search(rf"^#\s+{re.escape(algo)}\s+[\d.]+$", out, re.M)
    # The Sendrecv reference at the smallest size: ceil(lg 3) = 2 of them, and every
    # algorithm's 8-byte time as a multiple of that.
    reference = re.search(r"^# Small messages \(8 B\): .* takes ([\d.]+) us \(median call, "
                          r"same timing loop\); ceil\(lg p\) = 2 of them: ([\d.]+) us$",
                          out, re.M)
    assert reference and float(reference.group(2)) == pytest.approx(
        2 * float(reference.group(1)), abs=0.02), out
    footer = out.split("median time / (ceil(lg p) x Sendrecv):")[1]
    ratios = dict(re.findall(r"(\S+) ([\d.]+)x", footer))
    assert set(ratios) == set(algos) and all(float(v) > 0 for v in ratios.values()), out
    document = json.loads(out_json.read_text())
    assert len(document["rows"]) == len(rows) and document["wrong"] == 0
    assert document["sendrecv_reference"]["size"] == 8
    with h5py.File(out_h5) as f:
        assert f["allreduce"].shape == (len(rows),)
        assert set(f["allreduce"]["algo"]) == {a.encode() for a in algos}


def test_bench_allreduce_exits_non_zero_on_a_wrong_value(mpirun, hpctrain_cmd):
    result = mpirun(2, [*hpctrain_cmd, "bench", "allreduce", "--algos", "ring", "-b", "64",
                        "-e", "64", "-n", "1", "-w", "0"], timeout=120,
                    env={"HPCTRAIN_FAULT": "bench.corrupt@1"})
    assert result.returncode == 1, result.output
    assert "# Out of bounds values : 1 FAILED" in result.output


def test_bench_allreduce_rejects_an_unknown_algorithm_on_every_rank(mpirun, hpctrain_cmd):
    result = mpirun(2, [*hpctrain_cmd, "bench", "allreduce", "--algos", "ring,rign"],
                    timeout=60)
    assert result.returncode == 2
    assert "unknown allreduce algorithm(s) rign in --algos; valid:" in result.output
    assert "Traceback" not in result.output


def test_every_collective_plugin_has_its_command_line_and_fits_its_buffers():
    # One table: each plug-in carries its command line, which cli reads before parsing.
    def accepts(*argv):
        try:
            return build_parser().parse_args(["bench", *argv])
        except SystemExit:     # argparse's answer to an option the command does not take
            return None

    args = argparse.Namespace(op="sum", root=1)
    for name, plugin in blocks.PLUGINS.items():
        assert accepts(name).collective == name
        assert (bool(accepts(name, "-o", "max")), bool(accepts(name, "--root", "1"))) == \
            (plugin.reduces, plugin.rooted), name
        assert REGISTRIES[name], name
        # On 3 ranks, blocks of 5: each rank's input fills send, its exact result recv.
        for rank in range(3):
            send, recv = driver.buffers(plugin, 5, 3, torch.float32, "cpu")
            data = driver.Exact(torch.float32, "cpu", 3)
            assert plugin.inputs(5, rank, 3, data).shape == send.shape, name
            assert plugin.result(5, rank, 3, args, data).shape == recv.shape, name


def test_parsing_a_bench_command_line_imports_no_torch():
    # The plug-ins give cli its commands: reading them must stay light (no torch, no MPI,
    # no SciPy: 0.3 s more in every rank of every launch, for the cost model's fits alone).
    code = ("import sys; from hpctrain import cli; "
            "cli.parse_args(['bench', 'reduce', '-o', 'max', '--root', '1']); "
            "print(sorted(m for m in ('torch', 'mpi4py.MPI', 'scipy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "alltoall"])
def test_bench_collective_table_json_and_bus_factor(mpirun, hpctrain_cmd, tmp_path, collective):
    out_json = tmp_path / f"{collective}.json"
    algos = sorted(REGISTRIES[collective])
    op = ["-o", "prod"] if collective == "reducescatter" else []
    result = mpirun(3, [*hpctrain_cmd, "bench", collective, "--algos", ",".join(algos),
                        "-b", "96", "-e", "6K", "-f", "8", "-n", "3", "-w", "1", *op,
                        "--json", out_json], timeout=180)
    assert result.returncode == 0, result.output
    out = result.output
    assert out.startswith("# hpctrain") and f"bench {collective}" in out, out[:200]
    assert "# busbw = algbw * (p-1)/p = algbw * 0.667" in out, out
    rows = ROW.findall(out)
    # 96 B, 768 B, 6 KiB of float32 in 3 equal blocks: 24, 192, 1536 elements in all.
    assert [(int(r[0]), int(r[1]), r[3], r[4]) for r in rows] == \
        [(4 * count, count, "prod" if op else "none", algo) for count in (24, 192, 1536)
         for algo in algos], out
    assert all(r[10] == "0" for r in rows) and "# Out of bounds values : 0 OK" in out
    document = json.loads(out_json.read_text())
    assert document["benchmark"] == collective and document["wrong"] == 0
    for row in document["rows"]:
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 / 3)


def test_bench_collective_exits_non_zero_on_a_wrong_value(mpirun, hpctrain_cmd):
    result = mpirun(2, [*hpctrain_cmd, "bench", "reducescatter", "--algos", "butterfly", "-b",
                        "64", "-e", "64", "-n", "1", "-w", "0"], timeout=120,
                    env={"HPCTRAIN_FAULT": "bench.corrupt@1"})
    assert result.returncode == 1, result.output
    assert "# Out of bounds values : 1 FAILED" in result.output
    unknown = mpirun(2, [*hpctrain_cmd, "bench", "alltoall", "--algos", "ring"], timeout=60)
    assert unknown.returncode == 2
    assert "unknown alltoall algorithm(s) ring in --algos; valid: mpi, pairwise" \
        in unknown.output and "Traceback" not in unknown.output


def test_bench_broadcast_from_a_root_other_than_0_with_bus_factor_1(mpirun, hpctrain_cmd,
                                                                     tmp_path):
    out_json = tmp_path / "broadcast.json"
    algos = sorted(REGISTRIES["broadcast"])
    result = mpirun(3, [*hpctrain_cmd, "bench", "broadcast", "--algos", ",".join(algos),
                        "--root", "2", "-b", "100", "-e", "6400", "-f", "8", "-n", "3", "-w",
                        "1", "--json", out_json], timeout=180)
    assert result.returncode == 0, result.output
    out = result.output
    assert out.startswith("# hpctrain") and "bench broadcast" in out and " root 2" in out
    assert "# busbw = algbw (factor 1, as nccl-tests' broadcast); size: the whole vector, " \
        "from root 2" in out, out
    rows = ROW.findall(out)
    # 100 B, 800 B, 6400 B of float32, not cut into blocks: 25, 200, 1600 elements.
    assert [(int(r[0]), int(r[1]), r[3], r[4]) for r in rows] == \
        [(4 * count, count, "none", algo) for count in (25, 200, 1600) for algo in algos], out
    assert all(r[10] == "0" for r in rows) and "# Out of bounds values : 0 OK" in out
    document = json.loads(out_json.read_text())
    assert document["benchmark"] == "broadcast" and document["wrong"] == 0
    assert document["settings"]["root"] == 2
    assert all(row["busbw_GBps"] == row["algbw_GBps"] for row in document["rows"])


def test_bench_broadcast_counts_a_wrong_value_and_rejects_a_root_out_of_range(mpirun,
                                                                                hpctrain_cmd):
    result = mpirun(2, [*hpctrain_cmd, "bench", "broadcast", "--algos", "scatter_allgather",
                        "-b", "64", "-e", "64", "-n", "1", "-w", "0"], timeout=120,
                    env={"HPCTRAIN_FAULT": "bench.corrupt@1"})
    assert result.returncode == 1, result.output
    assert "# Out of bounds values : 1 FAILED" in result.output
    bad = mpirun(2, [*hpctrain_cmd, "bench", "broadcast", "--root", "2"], timeout=60)
    assert bad.returncode == 2
    assert "--root 2 is not a rank: valid values are 0 to 1" in bad.output \
        and "Traceback" not in bad.output


def test_bench_reduce_to_a_root_other_than_0_with_bus_factor_1(mpirun, hpctrain_cmd,
                                                                tmp_path):
    out_json = tmp_path / "reduce.json"
    algos = sorted(REGISTRIES["reduce"])
    # int64 avg: floor division, exact; the ranks off the root check their recv untouched.
    result = mpirun(3, [*hpctrain_cmd, "bench", "reduce", "--algos", ",".join(algos),
                        "--root", "2", "-d", "int64", "-o", "avg", "-b", "96", "-e", "6K",
                        "-f", "8", "-n", "3", "-w", "1", "--json", out_json], timeout=180)
    assert result.returncode == 0, result.output
    out = result.output
    assert out.startswith("# hpctrain") and "bench reduce" in out and " root 2" in out
    assert "# busbw = algbw (factor 1, as nccl-tests' reduce); size: the whole vector, " \
        "to root 2" in out, out
    rows = ROW.findall(out)
    # 96 B, 768 B, 6 KiB of int64, not cut into blocks: 12, 96, 768 elements.
    assert [(int(r[0]), int(r[1]), r[2], r[3], r[4]) for r in rows] == \
        [(8 * count, count, "int64", "avg", algo) for count in (12, 96, 768)
         for algo in algos], out
    assert all(r[10] == "0" for r in rows) and "# Out of bounds values : 0 OK" in out
    document = json.loads(out_json.read_text())
    assert document["benchmark"] == "reduce" and document["wrong"] == 0
    assert document["settings"]["root"] == 2 and document["settings"]["redop"] == "avg"
    assert all(row["busbw_GBps"] == row["algbw_GBps"] for row in document["rows"])


def test_bench_reduce_counts_a_value_written_off_the_root(mpirun, hpctrain_cmd):
    # Rank 1 is not the root: its recv must come back as it was, and a change counts.
    result = mpirun(2, [*hpctrain_cmd, "bench", "reduce", "--algos", "tree", "-b", "64",
                        "-e", "64", "-n", "1", "-w", "0"], timeout=120,
                    env={"HPCTRAIN_FAULT": "bench.corrupt@1"})
    assert result.returncode == 1, result.output
    assert "# Out of bounds values : 1 FAILED" in result.output


def test_bench_p2p_fits_alpha_and_beta(mpirun, hpctrain_cmd, tmp_path):
    out_json = tmp_path / "p2p.json"
    # Up to 8 MiB, so the largest message's copy time (milliseconds) stands well above the
    # latency noise of a busy machine: with 1 MiB at most, a loaded run fitted beta = 0.
    result = mpirun(2, [*hpctrain_cmd, "bench", "p2p", "-b", "8", "-e", "8M", "-f", "16",
                        "-n", "20", "--json", out_json], timeout=120)
    assert result.returncode == 0, result.output
    assert re.search(r"^# alpha \(latency\)\s+: [\d.]+ us$", result.output, re.M)
    document = json.loads(out_json.read_text())
    assert [row["size"] for row in document["rows"]] == [8, 128, 2048, 32768, 524288, 8 << 20]
    assert document["alpha_s"] > 0 and document["beta_s_per_byte"] > 0


def test_bench_p2p_needs_two_ranks(mpirun, hpctrain_cmd):
    result = mpirun(1, [*hpctrain_cmd, "bench", "p2p"], timeout=60)
    assert result.returncode == 2
    assert "bench p2p needs at least 2 ranks, got 1" in result.output


def test_fit_alpha_beta_never_goes_negative():
    # Small messages that beat the line (a burst allowance): the free fit's alpha is < 0.
    sizes = [1 << 20, 4 << 20, 16 << 20]
    seconds = [0.0067, 0.033, 0.138]
    alpha, beta = fit_alpha_beta(sizes, seconds)
    rates = [n / t for n, t in zip(sizes, seconds)]
    assert alpha == 0.0 and min(rates) < 1 / beta < max(rates)
    # Flat times (pure latency, noise makes the slope negative): beta is 0.
    alpha, beta = fit_alpha_beta([8, 64, 512], [2.1e-6, 2.0e-6, 1.9e-6])
    assert beta == 0.0 and alpha == pytest.approx(2.0e-6, rel=0.05)


def test_fit_alpha_beta_holding_beta_at_zero_is_the_least_squares_alpha():
    # Times that fall with size: beta is held at 0, and alpha minimises the relative
    # residuals sum((alpha / t - 1)^2), at sum(1/t) / sum(1/t^2), not at the harmonic mean.
    seconds = [3e-6, 2e-6, 1e-6]
    alpha, beta = fit_alpha_beta([8, 64, 512], seconds)
    inverse = [1 / t for t in seconds]
    assert beta == 0.0
    assert alpha == pytest.approx(sum(inverse) / sum(i * i for i in inverse), rel=1e-9)
    assert alpha != pytest.approx(len(seconds) / sum(inverse), rel=1e-3)


def test_bench_torch_distributed_times_hpctrain_beside_gloo_with_every_result_exact(
        mpirun, hpctrain_cmd, tmp_path):
    out_json = tmp_path / "versus.json"
    result = mpirun(2, [*hpctrain_cmd, "bench", "torch-distributed", "--sizes", "64K,1M",
                        "--rounds", "2", "-n", "1", "--train-steps", "2", "--json", out_json],
                    timeout=180)
    assert result.returncode == 0, result.output
    assert "# wrong results: 0" in result.output, result.output
    document = json.loads(out_json.read_text())
    assert document["settings"]["against"] == "gloo" and document["settings"]["device"] == "cpu"
    # The gloo rows are gloo's: torch hands new_group(backend="gloo") to our default group,
    # which would make an hpctrain group named gloo.
    assert document["settings"]["served_by"] == {"hpctrain": "ProcessGroupHpctrain",
                                                 "gloo": "ProcessGroupGloo"}
    rows = {(r["collective"], r["bytes"], r["backend"]): r for r in document["collectives"]}
    assert len(rows) == 3 * 2 * 2
    for (collective, _, _), row in rows.items():
        factor = (2 if collective == "all_reduce" else 1) * (2 - 1) / 2
        assert row["wrong"] == 0 and row["time_us"] > 0
        assert row["busbw_GBs"] == pytest.approx(row["algbw_GBs"] * factor)
    assert {(r["wrapper"], r["backend"]) for r in document["training"]} == \
        {(w, b) for w in ("DDP", "FSDP2") for b in ("hpctrain", "gloo")}
    assert all(r["samples_per_s"] > 0 for r in document["training"])
    assert "#   DDP  hpctrain:" in result.output and "# FSDP2      gloo:" in result.output


@pytest.mark.parametrize("args, says", [
    (["--against", "nccl"], "--against nccl does not take cpu tensors: use --against gloo"),
    (["--device", "cuda", "--against", "none"], "--device cuda"),
])
def test_bench_torch_distributed_refuses_what_it_cannot_run(args, says):
    from mpi4py import MPI

    from hpctrain.bench import torch_distributed
    from hpctrain.errors import Verdict

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --device cuda is no error here")
    parsed = build_parser().parse_args(["bench", "torch-distributed", *args])
    against = parsed.against or torch_distributed.AGAINST[parsed.device]
    with pytest.raises(Verdict, match=re.escape(says)):
        torch_distributed.check_arguments(parsed, against, MPI.COMM_SELF)


def test_bench_torch_distributed_refuses_on_every_rank_before_it_starts(mpirun, hpctrain_cmd):
    result = mpirun(2, [*hpctrain_cmd, "bench", "torch-distributed", "--against", "nccl"],
                    timeout=120)
    assert result.returncode == 2, result.output
    assert result.output.count("--against nccl does not take cpu tensors") == 1, result.output
    assert "Traceback" not in result.output, result.output
