"""The cost model in-process; the quick study end to end (it launches mpirun itself)."""

import json
import re
import sys

import h5py
import pytest

from hpctrain.study import costmodel
from hpctrain.study.allreduce import measured_crossover
from hpctrain.study.predict import prediction_table

PARAMS = costmodel.Params(alpha=2e-6, beta=1 / 10e9, gamma=1 / 20e9)


def test_ring_formula_matches_the_anchor():
    n, p = 64 << 20, 8
    expected = 2 * (p - 1) * PARAMS.alpha + 2 * n * (p - 1) / p * PARAMS.beta \
        + n * (p - 1) / p * PARAMS.gamma
    assert costmodel.predict("ring", n, p, PARAMS) == pytest.approx(expected)


def test_single_parameter_server_grows_with_ranks_and_ring_does_not():
    n = 256 << 20
    ps = [costmodel.predict("ps", n, p, PARAMS) for p in (2, 4, 8, 16)]
    ring = [costmodel.predict("ring", n, p, PARAMS) for p in (2, 4, 8, 16)]
    # ps: 2(p-1)·n·β dominates, so time/(p-1) is nearly constant; the ring stays below 2nβ+nγ.
    assert [t / (p - 1) for t, p in zip(ps, (2, 4, 8, 16))] == pytest.approx([ps[0]] * 4,
                                                                              rel=1e-3)
    assert max(ring) < 2 * n * PARAMS.beta + n * PARAMS.gamma + 32 * PARAMS.alpha
    assert costmodel.predict("ps-sharded", n, 16, PARAMS, servers=16) == \
        pytest.approx(costmodel.predict("ring", n, 16, PARAMS), rel=0.01)


def test_butterfly_folds_non_power_of_two_ranks():
    a4, b4, _ = costmodel.coefficients("butterfly", 8, 4)
    a5, b5, _ = costmodel.coefficients("butterfly", 8, 5)
    assert (a4, a5) == (2, 4) and b5 == b4 + 2 * 8


def test_no_communication_on_one_rank():
    assert all(costmodel.predict(a, 1 << 20, 1, PARAMS) == 0 for a in costmodel.MODELLED)


def test_fit_recovers_the_parameters_of_synthetic_measurements():
    points = [(algo, n, p, costmodel.predict(algo, n, p, PARAMS))
              for algo in ("ring", "tree", "butterfly", "ps") for p in (2, 3, 4, 8)
              for n in (8, 4096, 1 << 20, 64 << 20)]
    fitted = costmodel.fit(points)
    assert (fitted.alpha, fitted.beta, fitted.gamma) == \
        pytest.approx((PARAMS.alpha, PARAMS.beta, PARAMS.gamma), rel=1e-6)
    assert max(map(abs, costmodel.relative_errors(points, fitted))) < 1e-6


def test_fit_never_returns_negative_parameters():
    points = [("ring", n, 2, 1e-5) for n in (8, 1024, 1 << 20, 1 << 24)]
    fitted = costmodel.fit(points)
    assert min(fitted.alpha, fitted.beta, fitted.gamma) >= 0


def test_crossover_predicted_and_measured():
    size = costmodel.crossover("tree", 16, PARAMS)
    assert size is not None
    assert costmodel.predict("ring", size, 16, PARAMS) <= costmodel.predict("tree", size, 16,
                                                                            PARAMS)
    assert costmodel.predict("ring", size // 2, 16, PARAMS) > \
        costmodel.predict("tree", size // 2, 16, PARAMS)
    rows = [{"np": 4, "size": s, "algo": a, "time_median_us": t}
            for s, ring, tree in ((8, 9, 5), (64, 9, 6), (512, 8, 9), (4096, 10, 20))
            for a, t in (("ring", ring), ("tree", tree))]
    assert measured_crossover(rows, 4, "tree") == 512


@pytest.mark.parametrize("text, rate", [("100gbit", 12.5e9), ("800mbit", 1e8),
                                        ("42GB/s", 42e9), ("25Gbps", 3.125e9)])
def test_parse_rate(text, rate):
    assert costmodel.parse_rate(text) == pytest.approx(rate)


def test_prediction_table_reaches_thousands_of_ranks_and_a_gibibyte():
    rows = prediction_table(PARAMS)
    assert max(r["np"] for r in rows) == 4096 and max(r["size"] for r in rows) == 1 << 30
    ring = {r["np"]: r["busbw_GBps"] for r in rows if r["algo"] == "ring" and r["size"] == 1 << 30}
    ps = {r["np"]: r["busbw_GBps"] for r in rows if r["algo"] == "ps" and r["size"] == 1 << 30}
    assert ring[4096] > 0.9 * ring[2] and ps[4096] < ps[2] / 1000


def test_quick_study_writes_the_report(tmp_path):
    import subprocess

    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "hpctrain", "study", "allreduce", "--quick",
                           "--algos", "ring,tree,butterfly,ps,mpi", "--out", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    with h5py.File(out / "study.h5") as f:
        table = f["allreduce"][:]
        assert {int(p) for p in table["np"]} == {2, 3}
        assert (table["wrong"] == 0).all()
        assert f["p2p"].shape[0] > 0 and f["prediction"].shape[0] > 0
        assert json.loads(f["allreduce"].attrs["fitted"])["alpha"] >= 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {"busbw_p2.png", "busbw_p3.png", "prediction.png"} <= set(pngs)
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / "summary.md").read_text()
    assert "2 cores" in summary or "cores" in summary
    assert "oversubscribed points (more ranks than cores, marked *)" in summary
    assert "| 3* |" in summary or "p = none" in summary
    assert "Model error on every measured point" in summary
    params = json.loads((out / "params.json").read_text())
    assert set(params["fitted"]) == {"alpha", "beta", "gamma"}
    # The winners that --allreduce auto will use: one per measured (p, size).
    assert {p: len(rows) for p, rows in params["measured_best"].items()} == \
        {"2": len(set(table["size"])), "3": len(set(table["size"]))}


def test_study_times_auto_against_the_best_fixed_algorithm(tmp_path):
    import subprocess

    profile = tmp_path / "params.json"
    profile.write_text(json.dumps({
        "fitted": {"alpha": 1e-6, "beta": 1e-9, "gamma": 1e-10},
        "p2p_prior": {"alpha": 1e-6, "beta": 1e-9, "gamma": 1e-10},
        "measured_best": {"2": [[8, "tree"], [32768, "ring"]]}}))
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "hpctrain", "study", "allreduce", "--np", "2",
                           "--sizes", "8:32K", "--factor", "64", "--iters", "3",
                           "--algos", "ring,tree,mpi", "--profile", str(profile),
                           "--out", str(out)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    with h5py.File(out / "study.h5") as f:
        table = f["allreduce"][:]
    chose = {int(r["size"]): r["chose"].decode() for r in table if r["algo"] == b"auto"}
    assert chose == {8: "tree", 512: "tree", 32768: "ring"}
    summary = (out / "summary.md").read_text()
    assert "## `--allreduce auto` against the best fixed algorithm" in summary
    assert re.search(r"auto / best fixed: median [\d.]+, worst [\d.]+ over 3 points", summary)


def test_study_refuses_to_run_under_mpirun(mpirun, hpctrain_cmd):
    result = mpirun(2, [*hpctrain_cmd, "study", "allreduce", "--quick"], timeout=60)
    assert result.returncode == 2
    assert "run it as one process" in result.output
