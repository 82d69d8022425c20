"""The cost model in-process; the quick study end to end (it launches mpirun itself)."""

import argparse
import json
import os
import re
import subprocess
import sys
import time

import h5py
import pytest

from hpctrain.collectives import cost
from hpctrain.errors import UsageError
from hpctrain.study import allreduce, crossover, links, plots, predict
from hpctrain.study.allreduce import describe_crossover, measured_ring_wins
from hpctrain.study.config import AllreduceStudy
from hpctrain.study.predict import prediction_table

PNG = b"\x89PNG\r\n\x1a\n"

PARAMS = cost.Params(alpha=2e-6, beta=1 / 10e9, gamma=1 / 20e9)


def test_ring_formula_matches_the_anchor():
    n, p = 64 << 20, 8
    expected = 2 * (p - 1) * PARAMS.alpha + 2 * n * (p - 1) / p * PARAMS.beta \
        + n * (p - 1) / p * PARAMS.gamma
    assert cost.predict("ring", n, p, PARAMS) == pytest.approx(expected)


def test_single_parameter_server_grows_with_ranks_and_ring_does_not():
    n = 256 << 20
    ps = [cost.predict("ps", n, p, PARAMS) for p in (2, 4, 8, 16)]
    ring = [cost.predict("ring", n, p, PARAMS) for p in (2, 4, 8, 16)]
    # ps: 2(p-1)·n·β dominates, so time/(p-1) is nearly constant; the ring stays below 2nβ+nγ.
    assert [t / (p - 1) for t, p in zip(ps, (2, 4, 8, 16))] == pytest.approx([ps[0]] * 4,
                                                                              rel=1e-3)
    assert max(ring) < 2 * n * PARAMS.beta + n * PARAMS.gamma + 32 * PARAMS.alpha
    assert cost.predict("ps-sharded", n, 16, PARAMS, servers=16) == \
        pytest.approx(cost.predict("ring", n, 16, PARAMS), rel=0.01)


def test_butterfly_folds_non_power_of_two_ranks():
    a4, b4, *_ = cost.coefficients("butterfly", 8, 4)
    a5, b5, *_ = cost.coefficients("butterfly", 8, 5)
    assert (a4, a5) == (2, 4) and b5 == b4 + 2 * 8


def test_no_communication_on_one_rank():
    assert all(cost.predict(a, 1 << 20, 1, PARAMS) == 0 for a in cost.modelled())


def test_fit_recovers_the_parameters_of_synthetic_measurements():
    points = [(algo, n, p, cost.predict(algo, n, p, PARAMS))
              for algo in ("ring", "tree", "butterfly", "ps") for p in (2, 3, 4, 8)
              for n in (8, 4096, 1 << 20, 64 << 20)]
    fitted = cost.fit(points)
    assert (fitted.alpha, fitted.beta, fitted.gamma) == \
        pytest.approx((PARAMS.alpha, PARAMS.beta, PARAMS.gamma), rel=1e-6)
    assert max(map(abs, cost.relative_errors(points, fitted))) < 1e-6


def test_fit_never_returns_negative_parameters():
    points = [("ring", n, 2, 1e-5) for n in (8, 1024, 1 << 20, 1 << 24)]
    fitted = cost.fit(points)
    assert min(fitted.alpha, fitted.beta, fitted.gamma) >= 0


def measured_crossover(rows, ranks, other):
    return crossover.crossover_size(*measured_ring_wins(rows, ranks, other))


def test_crossover_predicted_and_measured():
    sizes = crossover.powers_of_two()
    size = crossover.crossover_size(sizes, crossover.ring_wins("tree", 16, PARAMS, sizes))
    assert size is not None
    assert cost.predict("ring", size, 16, PARAMS) <= cost.predict("tree", size, 16,
                                                                            PARAMS)
    assert cost.predict("ring", size // 2, 16, PARAMS) > \
        cost.predict("tree", size // 2, 16, PARAMS)
    rows = [{"np": 4, "size": s, "algo": a, "time_median_us": t}
            for s, ring, tree in ((8, 9, 5), (64, 9, 6), (512, 8, 9), (4096, 10, 20))
            for a, t in (("ring", ring), ("tree", tree))]
    assert measured_crossover(rows, 4, "tree") == 512


def _rows(ranks, other, sizes, ring_times, other_times):
    return [{"np": ranks, "size": s, "algo": a, "time_median_us": t}
            for s, r, o in zip(sizes, ring_times, other_times)
            for a, t in (("ring", r), (other, o))]


def test_crossover_is_where_the_ring_stops_losing_for_good_measured_and_predicted():
    # The ring wins at 64 B, loses at 512 B, wins from 4 KiB on: the crossover is 4 KiB,
    # not 64 B (the first size where the ring wins).
    sizes = [8, 64, 512, 4096, 32768]
    rows = _rows(4, "tree", sizes, [9, 5, 9, 5, 5], [6, 6, 6, 6, 6])
    assert measured_crossover(rows, 4, "tree") == 4096
    # The model's butterfly at p = 4 is not monotone either: with a small α the ring wins
    # from 4 KiB up to 32 KiB, and loses again once the butterfly switches to Rabenseifner
    # at 64 KiB (same bytes, 4 messages against the ring's 6).
    params = cost.Params(alpha=1e-7, beta=1e-10, gamma=5e-11)
    sizes = crossover.powers_of_two(8, 1 << 20)
    wins = crossover.ring_wins("butterfly", 4, params, sizes)
    assert wins[sizes.index(4096)] and wins[sizes.index(32768)] and not wins[-1]
    assert crossover.crossover_size(sizes, wins) is None


def test_the_summary_tells_always_from_never():
    sizes = [8, 64, 512]
    assert describe_crossover(sizes, [True, True, True]) == \
        "ring always wins in range (8 B+)"
    assert describe_crossover(sizes, [False, False, False]) == "ring never wins in range"
    assert describe_crossover(sizes, [False, True, False]) == \
        "none: ring wins only below the largest size"
    assert describe_crossover(sizes, [True, False, True]) == "from 512 B"
    assert crossover.crossover_size(sizes, [True] * 3) == 8
    assert crossover.crossover_size(sizes, [True, True, False]) is None


def _synthetic(scale_over=1.0, algos=("ring", "tree", "butterfly", "ps")):
    # Exact model times at p = 2; at p = 3 (oversubscribed on 2 cores) ``scale_over`` times.
    return [(algo, n, p, cost.predict(algo, n, p, PARAMS) * (scale_over if p > 2 else 1))
            for algo in algos for p in (2, 3) for n in (8, 4096, 1 << 20, 64 << 20)]


def test_fit_leaves_out_oversubscribed_points_when_the_others_suffice():
    points = _synthetic(scale_over=5.0)   # ranks taking turns on 2 cores: 5x slower
    assert allreduce.fit_plan(points, cores=2) == ([2], True)
    fitted = cost.fit([pt for pt in points if pt[2] == 2])
    assert (fitted.alpha, fitted.beta, fitted.gamma) == \
        pytest.approx((PARAMS.alpha, PARAMS.beta, PARAMS.gamma), rel=1e-6)
    assert allreduce.fit_plan(points, cores=4) == ([2, 3], True)


def test_points_that_cannot_separate_beta_from_gamma_keep_the_measured_gamma():
    # Ring and parameter server send twice the bytes they reduce at every p: no choice of
    # rank counts separates β from γ, and a free fit would split 2β + γ arbitrarily.
    both = _synthetic(algos=("ring", "ps"))
    assert not cost.determined(both)
    assert allreduce.fit_plan(both, cores=2) == ([2], False)
    fitted = cost.fit([pt for pt in both if pt[2] == 2], gamma=PARAMS.gamma)
    assert (fitted.alpha, fitted.beta, fitted.gamma) == \
        pytest.approx((PARAMS.alpha, PARAMS.beta, PARAMS.gamma), rel=1e-6)
    rows = [{"np": p, "size": n, "algo": a} for a, n, p, _ in both]
    assert allreduce.fit_note(rows, [2], cores=2, all_three=False).startswith(
        "α and β fitted to the 8 measured points at p = 2; γ is the local add's, measured")


def test_the_summary_says_which_points_were_fitted():
    rows = [{"np": p, "size": n, "algo": a, "time_median_us": t * 1e6,
             "oversubscribed": int(p > 2), "model_us": t * 1e6}
            for a, n, p, t in _synthetic(scale_over=5.0)]
    note = allreduce.fit_note(rows, [2], cores=2)
    assert note.startswith("Fitted to the 16 measured points at p = 2, none oversubscribed")
    assert "p = 3, marked *" in note
    assert "oversubscribed ones (*) included" in allreduce.fit_note(rows, [2, 3], cores=2)
    table = allreduce._point_table(rows, [2])
    assert "| 3* | 8 B | ring |" in table and table.count("| yes |") == 16 \
        and table.count("| no |") == 16
    errors = allreduce._error_summary(rows, PARAMS, PARAMS, [2])
    assert "| ring | 0% | 0% | 80% |" in errors    # (1 - 5) / 5 at every p = 3 point


@pytest.mark.parametrize("text, rate", [("100gbit", 12.5e9), ("800mbit", 1e8),
                                        ("42GB/s", 42e9), ("25Gbps", 3.125e9)])
def test_parse_rate(text, rate):
    assert links.parse_rate(text) == pytest.approx(rate)


def test_prediction_table_reaches_thousands_of_ranks_and_a_gibibyte():
    rows = prediction_table(PARAMS)
    assert max(r["np"] for r in rows) == 4096 and max(r["size"] for r in rows) == 1 << 30
    ring = {r["np"]: r["busbw_GBps"] for r in rows if r["algo"] == "ring" and r["size"] == 1 << 30}
    ps = {r["np"]: r["busbw_GBps"] for r in rows if r["algo"] == "ps" and r["size"] == 1 << 30}
    assert ring[4096] > 0.9 * ring[2] and ps[4096] < ps[2] / 1000


def test_prediction_tables_give_time_and_busbw_and_the_growth_of_ps():
    text = predict.prediction_markdown(prediction_table(PARAMS))
    time_part, busbw_part = text.split("Bus bandwidth (GB/s):")
    assert time_part.startswith("Time (µs):")
    algos = sorted(cost.modelled())
    header = "| p | size | " + " | ".join(algos) + " | fastest |"
    assert header in time_part and header in busbw_part
    row = re.search(r"^\| 4096 \| 1 GiB \| .*$", busbw_part, re.M).group(0).split(" | ")
    ring, ps = float(row[2 + algos.index("ring")]), float(row[2 + algos.index("ps")])
    seconds = cost.predict("ring", 1 << 30, 4096, PARAMS)
    assert ring == pytest.approx(links.busbw(1 << 30, 4096, seconds) / 1e9, rel=1e-2)
    # The ring's busbw at any p stays near 2 / (2β + γ); the single server's falls as 1/p.
    assert ring > 0.9 * 2 / (2 * PARAMS.beta + PARAMS.gamma) / 1e9 and ps < ring / 1000
    growth = re.search(r"From p = 2 to p = 4096 at 1 GiB: ps ×([\d.]+), ring ×([\d.]+)", text)
    assert float(growth.group(1)) == pytest.approx(4095, rel=1e-3)
    assert 2 < float(growth.group(2)) < 2.2   # 2(p-1)/p·n/b ×2, plus 2(p-1)α: 16 ms of 0.13 s


def _predict_args(tmp_path, **kw):
    return argparse.Namespace(**{"params": None, "link": None, "alpha": "2us",
                                 "gamma_rate": "20GB/s", "out": str(tmp_path), **kw})


def test_predict_writes_both_plots_and_falls_back_like_auto(tmp_path, capsys):
    profile = tmp_path / "params.json"
    profile.write_text(json.dumps({"fitted": {"alpha": 5e-6, "beta": 0.0, "gamma": 0.0},
                                   "p2p_prior": {"alpha": 1e-6, "beta": 1e-10,
                                                 "gamma": 5e-11}}))
    params, note, per_node = predict.load_params(_predict_args(tmp_path, params=str(profile)))
    assert per_node == predict.RANKS_PER_NODE   # neither the study nor the command says
    assert params == cost.Params(1e-6, 1e-10, 5e-11) and "p2p prior" in note
    assert predict.run(_predict_args(tmp_path, params=str(profile))) == 0
    for name in ("prediction.png", "prediction_time.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG
    written = (tmp_path / "prediction.md").read_text()
    assert "p2p prior" in written and "Bus bandwidth (GB/s):" in written
    with pytest.raises(UsageError, match="not a study's params.json"):
        predict.load_params(_predict_args(tmp_path, params=str(tmp_path / "prediction.md")))


def _capture_figures(monkeypatch):
    saved = {}
    monkeypatch.setattr(plots, "save", lambda fig, path: saved.setdefault(path, fig))
    return saved


def _faces(fig):
    """{(x, y): 'hollow' or 'filled'} of every single-point marker in ``fig``."""
    from matplotlib.colors import to_rgba

    out = {}
    for line in fig.axes[0].lines:
        for x, y in zip(line.get_xdata(), line.get_ydata()):
            if line.get_marker() not in ("None", None, ""):
                out[(x, y)] = "hollow" if to_rgba(line.get_markerfacecolor()) == \
                    to_rgba("white") else "filled"
    return out


def test_plots_draw_oversubscribed_points_hollow(monkeypatch):
    saved = _capture_figures(monkeypatch)
    rows = [{"np": p, "size": n, "algo": a, "time_median_us": 10.0 * p + n / 1e3 + i,
             "busbw_GBps": 1.0 + p + n / 1e4 + i}
            for i, a in enumerate(("ring", "tree")) for p in (2, 3) for n in (8, 4096)]
    plots.time_vs_ranks(rows, 8, PARAMS, "t.png", cores=2)
    faces = _faces(saved["t.png"])
    assert faces[(2, 20.008)] == faces[(2, 21.008)] == "filled"
    assert faces[(3, 30.008)] == faces[(3, 31.008)] == "hollow"
    plots.busbw_vs_size(rows, 2, "b2.png", cores=2)
    plots.busbw_vs_size(rows, 3, "b3.png", cores=2)
    assert set(_faces(saved["b2.png"]).values()) == {"filled"}
    assert set(_faces(saved["b3.png"]).values()) == {"hollow"}
    assert "oversubscribed" in saved["b3.png"].axes[0].get_title()


@pytest.mark.parametrize("sizes", ["0:64M", "0:0", "2:64M"])
def test_study_refuses_sizes_from_zero(sizes):
    with pytest.raises(UsageError, match="--sizes minimum must be at least 4 bytes"):
        allreduce._size_span(sizes, 4)


def _study_args(tmp_path, *argv):
    import argparse

    from hpctrain.study import cli

    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["study", "allreduce", "--out", str(tmp_path), *argv])


class _Launched(Exception):
    pass


def _first_bench(monkeypatch, args):
    """The arguments of the study's first benchmark launch (nothing is launched)."""
    seen = []

    def bench(_args, p, kind, *options):
        seen.append((p, kind) + tuple(str(o) for o in options))
        raise _Launched
    monkeypatch.setattr(allreduce, "_bench", bench)
    with pytest.raises(_Launched):
        allreduce.run(args)
    return seen[0]


def test_study_takes_zero_warmup_as_given_and_its_defaults_from_one_table(tmp_path,
                                                                        monkeypatch):
    # --warmup 0 once became 2 (a fallback written `args.warmup or 2`); the defaults and
    # --quick's values live in one place, the command's dataclass.
    launch = _first_bench(monkeypatch, _study_args(tmp_path, "--warmup", "0"))
    assert launch[launch.index("-w") + 1] == "0"
    launch = _first_bench(monkeypatch, _study_args(tmp_path))
    defaults = AllreduceStudy()
    assert launch[launch.index("-w") + 1] == str(defaults.warmup)
    assert launch[launch.index("-n") + 1] == str(defaults.iters * 5)
    assert launch[launch.index("-f") + 1] == str(defaults.factor)
    quick = _first_bench(monkeypatch, _study_args(tmp_path, "--quick", "--iters", "3"))
    assert quick[quick.index("-n") + 1] == "15"         # given beats --quick
    assert quick[quick.index("-w") + 1] == str(AllreduceStudy.PRESETS["quick"]["warmup"])


def test_study_help_states_the_defaults_it_uses(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _study_args(tmp_path, "--help")
    text = " ".join(capsys.readouterr().out.split())
    for key in ("np", "sizes", "factor", "iters", "warmup"):
        assert f"(default: {getattr(AllreduceStudy(), key)})" in text, key


@pytest.mark.parametrize("option, value, least", [
    ("--iters", "0", 1), ("--warmup", "-1", 0), ("--factor", "1", 2),
    ("--ranks-per-node", "-2", 0)])
def test_study_refuses_a_count_below_its_least(tmp_path, capsys, option, value, least):
    # Refused by the command line, in one line naming the option and a good value.
    with pytest.raises(SystemExit) as exit_:
        _study_args(tmp_path, option, value)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{option}: {value!r}: give a whole number >= {least}; " \
        f"e.g. {option} " in err, err


@pytest.mark.alone
def test_study_refuses_sizes_from_zero_before_launching(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hpctrain", "study", "allreduce", "--sizes",
                           "0:64M", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--sizes minimum must be at least 4 bytes" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr and "[study] p2p" not in done.stdout


def _auto_rows(times):
    # times: {algo: (first run, second run)} at p = 2, 8 B.
    make = [{"np": 2, "size": 8, "algo": a, "time_median_us": t[i], "chose": "ring"}
            for a, t in times.items() for i in (0, 1)]
    return make[0::2], make[1::2]


def test_auto_verdict_against_the_noise_of_repeated_runs():
    # tree / ring was 2.00 in one run and 2.18 in the other: noise 9 %; auto / ring was
    # 1.10 and 1.045, geometric mean 1.07: within noise.
    rows, repeat = _auto_rows({"ring": (10, 11), "tree": (20, 24), "auto": (11, 11.5)})
    (point,) = allreduce.auto_points(rows, repeat)
    assert point["best"] == "ring" and point["chose"] == "ring"
    assert point["noise"] == pytest.approx(24 / 11 / 2 - 1)
    assert point["ratio"] == pytest.approx((1.1 * 11.5 / 11) ** 0.5)
    assert allreduce.within_noise(point)
    assert allreduce.auto_verdict([point]).startswith(
        "Verdict: auto is never slower than the best fixed choice beyond noise (1 points")
    # Every algorithm 10x slower in the second run (another job started): the ratios did
    # not move, so the noise is 0 and auto's 5 % is beyond it.
    rows, repeat = _auto_rows({"ring": (10, 100), "tree": (20, 200), "auto": (10.5, 105)})
    (point,) = allreduce.auto_points(rows, repeat)
    assert point["noise"] == pytest.approx(0) and point["ratio"] == pytest.approx(1.05)
    assert not allreduce.within_noise(point)
    assert allreduce.auto_verdict([point]) == (
        "Verdict: auto is slower than the best fixed choice beyond noise at 1 of 1 points: "
        "p = 2 8 B (1.05 > 1 + 0.00).")
    assert "noise is unknown" in allreduce.auto_verdict(allreduce.auto_points(rows, []))


@pytest.mark.alone
def test_quick_study_writes_the_report(tmp_path):
    out = tmp_path / "report"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hpctrain", "study", "allreduce", "--quick",
                           "--algos", "ring,tree,butterfly,ps,mpi", "--out", str(out)],
                          capture_output=True, text=True, timeout=240)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    # The README's promise, kept as an absolute bound: the whole run is what a user waits
    # for. docs/studies.md measured 24-33 s under a load average of 4-6 (24 s again at 6-7):
    # 120 s leaves 4x for a busier machine and still fails a study gone several times slower.
    assert elapsed < 120, f"--quick took {elapsed:.0f} s, promised under 2 minutes"
    with h5py.File(out / "study.h5") as f:
        table = f["allreduce"][:]
        assert {int(p) for p in table["np"]} == {2, 3}
        assert (table["wrong"] == 0).all()
        assert f["p2p"].shape[0] > 0 and f["prediction"].shape[0] > 0
        assert json.loads(f["allreduce"].attrs["fitted"])["alpha"] >= 0
        assert int(f["allreduce"].attrs["cores"]) == os.cpu_count()
    sizes = sorted({int(s) for s in table["size"]})
    assert sizes == [8, 128, 2048, 32768, 524288]
    pngs = {p.name for p in out.glob("*.png")}
    assert {"busbw_p2.png", "busbw_p3.png", "prediction.png", "prediction_time.png"} <= pngs
    # time against p at the smallest, a middle and the largest size
    assert {f"time_vs_p_{s}B.png" for s in (8, 2048, 524288)} <= pngs
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5000, png.name
    summary = (out / "summary.md").read_text()
    cores = os.cpu_count()
    assert f"- machine: {cores} cores;" in summary
    assert "oversubscribed points (more ranks than cores, marked *)" in summary
    if cores < 3:
        assert "| 3* |" in summary and "at p = 2, none oversubscribed" in summary
    else:
        assert "p = none" in summary
    assert "Model error on every measured point" in summary
    assert re.search(r"\| 3\*? \| tree \| [^|]+ \| [^|]+ \| (from|ring|none)", summary)
    params = json.loads((out / "params.json").read_text())
    assert set(params["fitted"]) == {"alpha", "beta", "gamma"}
    assert params["fit_ranks"] == ([2] if cores < 3 else [2, 3])
    # The winners that --allreduce auto will use: one per measured (p, size).
    assert {p: len(rows) for p, rows in params["measured_best"].items()} == \
        {"2": len(set(table["size"])), "3": len(set(table["size"]))}


@pytest.mark.alone
def test_study_times_auto_against_the_best_fixed_algorithm(tmp_path):
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
    assert "run 2 of 2" in done.stdout
    with h5py.File(out / "study.h5") as f:
        table = f["allreduce"][:]
        repeat = f["allreduce_repeat"][:]
    for rows in (table, repeat):
        chose = {int(r["size"]): r["chose"].decode() for r in rows if r["algo"] == b"auto"}
        assert chose == {8: "tree", 512: "tree", 32768: "ring"}
    summary = (out / "summary.md").read_text()
    assert "## `--allreduce auto` against the best fixed algorithm" in summary
    assert re.search(r"auto / best fixed: median [\d.]+, worst [\d.]+ over 3 points", summary)
    points = re.findall(r"^\| 2 \| [^|]+ \| (tree|ring) \| [\d.]+ \| (?:ring|tree|mpi) \| "
                        r"[\d.]+ \| [\d.]+ \| \d+% \| (within noise|SLOWER) \|$", summary, re.M)
    assert len(points) == 3, summary
    verdict = re.findall(r"^Verdict: auto is (never slower|slower) than the best fixed choice "
                         r"beyond noise", summary, re.M)
    assert verdict == (["never slower"] if all(v == "within noise" for _, v in points)
                       else ["slower"])
    assert "[study] Verdict: auto is" in done.stdout


def test_study_refuses_to_run_under_mpirun(mpirun, hpctrain_cmd):
    result = mpirun(2, [*hpctrain_cmd, "study", "allreduce", "--quick"], timeout=60)
    assert result.returncode == 2
    assert "run it as one process" in result.output
