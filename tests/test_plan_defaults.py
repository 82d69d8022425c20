"""What a plan takes for the terms its user does not give (data/defaults.toml), the published
runs it is held against (data/published.toml, study calibrate), and bad files."""

import json
import re
import subprocess
import sys
from dataclasses import replace

import pytest

from hpctrain.cli import build_parser
from hpctrain.collectives import cost
from hpctrain.errors import UsageError
from hpctrain.study import calibration, defaults, links, plan, plan_report, planner, step
from hpctrain.study.architectures import Layer
from hpctrain.study.overheads import Figure, Overheads, exact

GOOD = '''
[spread]
low = 0.001
high = 0.003
source = "a jitter"
basis = "term"
[slowdown]
low = 1.02
high = 1.04
source = "two SMs"
basis = "term"
[slowdown_node]
low = 1.5
high = 2.5
source = "memory bandwidth"
basis = "term"
[update_s]
low = 0
high = 0
source = "in one device's rate"
basis = "argument"
[tensor_s]
low = 1e-5
high = 3e-5
source = "measured"
basis = "term"
[rank_s]
low = 0
high = 0
source = "none seen"
basis = "term"
[framework_ddp]
low = 2e-5
high = 4e-5
source = "with and without the wrapper"
basis = "term"
[framework_hpctrain]
low = 2e-5
high = 4e-5
source = "the same mechanism"
basis = "argument"
[framework_horovod]
low = 0
high = 0
source = "none seen"
basis = "term"
[share]
low = 0.02
high = 0.1
source = "whole runs"
basis = "whole runs"
[share_node]
low = 0
high = 0.04
source = "one node's runs"
basis = "whole runs"
'''


def write(tmp_path, text, name="defaults.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_every_default_is_a_range_with_its_middle_its_source_and_its_basis():
    shipped = defaults.load()
    assert set(shipped.figures) == set(defaults.TERMS)
    for term, fig in shipped.figures.items():
        assert fig.low <= fig.value <= fig.high and fig.value == pytest.approx(
            (fig.low + fig.high) / 2)
        assert fig.source.startswith("default, ") and shipped.basis[term] in defaults.BASES
    # The residuals' ranges are the ones chosen on whole runs, and say on which.
    assert shipped.basis["share"] == "whole runs" and shipped.figures["share"].low > 0
    assert shipped.basis["share_node"] == "whole runs"
    assert "study calibrate --tune" in shipped.figures["share_node"].source
    assert "held-out" in shipped.figures["share_node"].source
    # Inside one NVLink node less is unexplained than where reductions leave it.
    assert shipped.figures["share_node"].value < shipped.figures["share"].value
    assert shipped.path == "hpctrain/study/data/defaults.toml"     # no machine path


def test_a_link_inside_a_node_other_than_nvlink_takes_the_network_slowdown(tmp_path):
    mine = defaults.load(write(tmp_path, GOOD))
    assert mine.overheads(nvlink=True).slowdown_node == mine.figures["slowdown_node"]
    assert mine.overheads(nvlink=False).slowdown_node.value == pytest.approx(1.03)
    inputs = Overheads(slowdown=exact(1.5), slowdown_node=exact(3.0))
    assert (inputs.slowdown_at(1), inputs.slowdown_at(2)) == (3.0, 1.5)
    # And the residual of a step that leaves the node: PCIe crosses the host as a network does.
    assert mine.overheads(nvlink=True).share_node == mine.figures["share_node"]
    assert mine.overheads(nvlink=False).share_node.value == pytest.approx(0.06)


def test_the_residual_inside_one_nvlink_node_is_its_own_share(tmp_path):
    mine = defaults.load(write(tmp_path, GOOD))
    layers = [Layer("a", 8 << 20, 1.0), Layer("b", 8 << 20, 1.0)]
    cluster = planner.links_cluster(4, links.PRESETS["nvlink-v100"], links.PRESETS["ib-edr"])

    def residuals(nvlink):
        rows = planner.plan(layers, 64, 200.0, cluster, 16, ["ring"], ["ddp"],
                            overheads=mine.overheads(nvlink))
        return {row["np"]: row["residual_s"] / row["compute_s"] for row in rows}
    # 1 rank: none; 2 and 4 inside one node: share_node's middle; 8 and 16 leave it: share's.
    assert residuals(True) == pytest.approx({1: 0, 2: 0.02, 4: 0.02, 8: 0.06, 16: 0.06})
    assert residuals(False) == pytest.approx({1: 0, 2: 0.06, 4: 0.06, 8: 0.06, 16: 0.06})
    # A measured efficiency replaces both.
    calibrated = replace(mine.overheads(True), measured=exact(0.9), measured_p=2).solved(1.0, 1.0)
    assert calibrated.residual_s(1.0, 2, inside_node=True) == pytest.approx(1 / 0.9 - 1)
    for gpus, intra, term in ((8, "nvlink-v100", "share_node"), (16, "nvlink-v100", "share"),
                              (8, "pcie3", "share")):
        text = RUN.replace("gpus = 16", f"gpus = {gpus}").replace('"nvlink-v100"', f'"{intra}"')
        (run,) = calibration.load(write(tmp_path, text, "runs.toml"))
        assert calibration.residual_term(run) == term, (gpus, intra)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("low = 1.02\nhigh = 1.04", "low = 1.04\nhigh = 1.02"),
     "entry [slowdown]: low 1.04 is above high 1.02 (a range given backwards); e.g. "
     "[slowdown] low = 1.015"),
    (lambda t: t.replace('[share]\nlow = 0.02\nhigh = 0.1\nsource = "whole runs"\n'
                         'basis = "whole runs"\n', ""), "entry [share] is missing"),
    (lambda t: t.replace("low = 0\nhigh = 0.04", "low = 0.04\nhigh = 0"),
     "entry [share_node]: low 0.04 is above high 0 (a range given backwards)"),
    (lambda t: t.replace('[share_node]\nlow = 0\nhigh = 0.04\nsource = "one node\'s runs"\n'
                         'basis = "whole runs"\n', ""), "entry [share_node] is missing"),
    (lambda t: t.replace('source = "two SMs"\n', ""), "entry [slowdown]: no source"),
    (lambda t: t.replace('basis = "argument"', 'basis = "hunch"'),
     "entry [update_s]: basis 'hunch' is not one of"),
    (lambda t: t.replace("low = 1.5", "low = 0.5"), "entry [slowdown_node]: low 0.5 is below 1"),
    (lambda t: t.replace("low = 0.001", 'low = "small"'), "entry [spread]: low and high must be "
                                                         "numbers"),
    (lambda t: t.replace("low = 2e-5\nhigh = 4e-5\nsource = \"with", "low = 4e-5\nhigh = 2e-5\n"
                         "source = \"with"),
     "entry [framework_ddp]: low 4e-05 is above high 2e-05 (a range given backwards); e.g. "
     "[slowdown] low = 1.015"),
    (lambda t: t.replace('[framework_horovod]\nlow = 0\nhigh = 0\nsource = "none seen"\n'
                         'basis = "term"\n', ""), "entry [framework_horovod] is missing"),
    (lambda t: t + "[stragglers]\nlow = 0\n", "unknown entry [stragglers]"),
    (lambda t: t + "[[broken", "not TOML"),
])
def test_a_malformed_defaults_file_names_the_entry_and_a_good_one(tmp_path, edit, message):
    path = write(tmp_path, edit(GOOD))
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        defaults.load(path)


def test_without_inputs_no_term_is_zero_and_a_given_term_replaces_its_default(tmp_path):
    mine = defaults.load(write(tmp_path, GOOD))
    layers = [Layer("a", 8 << 20, 1.0), Layer("b", 8 << 20, 1.0)]
    cluster = planner.links_cluster(2, links.PRESETS["pcie3"], links.PRESETS["25gbe"])
    inputs = mine.overheads()
    row = planner.plan(layers, 64, 200.0, cluster, 8, ["ring"], ["horovod"], cycle_ms=0,
                    overheads=inputs)[-1]
    for key in ("negotiation_s", "slowdown_s", "straggler_s", "residual_s"):
        assert row[key] > 0, key
    # The residual is the share's middle of compute; a measured efficiency replaces it.
    assert row["residual_s"] == pytest.approx(0.06 * row["compute_s"])
    calibrated = replace(inputs, measured=exact(0.9), measured_p=2).solved(1.0, 1.0)
    assert calibrated.residual_s(1.0, 2) == pytest.approx(1 / 0.9 - 1)
    given = plan.overheads_of(_args(spread="0"), [1, 2], defaults=mine)
    assert given.spread == Figure(0.0, 0.0, 0.0, "given (--spread)")
    assert given.share == mine.figures["share"]
    slow = plan.overheads_of(_args(slowdown="1.1"), [1, 2], defaults=mine, nvlink=True)
    assert slow.slowdown.value == slow.slowdown_node.value == 1.1


def test_the_frameworks_own_work_defaults_per_policy_and_is_given_once_for_all(tmp_path):
    mine = defaults.load(write(tmp_path, GOOD))
    inputs = mine.overheads()
    assert inputs.framework_at("ddp") == mine.figures["framework_ddp"]
    assert inputs.framework_at("horovod").value == 0
    # --framework-us is the framework the user runs: it replaces every policy's default.
    given = plan.overheads_of(_args(framework_us="30:19:48"), [1, 2], defaults=mine)
    for policy in step.POLICIES:
        fig = given.framework_at(policy)
        assert (fig.value, fig.low, fig.high) == pytest.approx((30e-6, 19e-6, 48e-6))
        assert fig.source == "given (--framework-us)"
    # The shipped DDP range is DDP's own measurement, not a fit.
    shipped = defaults.load()
    assert shipped.basis["framework_ddp"] == "term"
    assert (shipped.figures["framework_ddp"].low, shipped.figures["framework_ddp"].high) == \
        (19e-6, 48e-6)


def test_unexplained_is_the_residual_that_would_put_the_point_on_the_published_figure(
        tmp_path):
    (run,) = calibration.load(write(tmp_path, RUN, "runs.toml"))
    mine = defaults.load(write(tmp_path, GOOD))
    (row,) = calibration.calibrate([run], mine)
    assert calibration.residual_term(run) == "share" and row["unexplained"] > 0
    assert row["point"] != pytest.approx(row["published"])
    fitted = replace(mine, figures={**mine.figures, "share": exact(row["unexplained"])})
    assert calibration.predict(run, fitted)["point"] == pytest.approx(row["published"])


def test_a_rate_measured_under_the_wrapper_is_not_charged_the_wrapper_again(tmp_path):
    wrapped = RUN.replace('policy = "ddp"', 'policy = "ddp"\nrate_with_wrapper = true')
    (run,) = calibration.load(write(tmp_path, wrapped, "wrapped.toml"))
    (plain,) = calibration.load(write(tmp_path, RUN, "plain.toml"))
    assert run.rate_with_wrapper and not plain.rate_with_wrapper
    mine = defaults.load(write(tmp_path, GOOD))
    assert calibration.predict(run, mine)["point"] > calibration.predict(plain, mine)["point"]
    bad = RUN.replace('policy = "ddp"', 'policy = "ddp"\nrate_with_wrapper = "yes"')
    with pytest.raises(UsageError, match="run 'a': rate_with_wrapper must be true or false"):
        calibration.load(write(tmp_path, bad, "bad.toml"))


def _args(**given):
    names = ("spread", "slowdown", "update_ms", "negotiation_us", "negotiation_rank_us",
             "framework_us", "measured_efficiency")
    return type("Args", (), {name: given.get(name) for name in names})()


def test_the_widest_input_comes_first_and_is_said_in_words():
    def efficiency(ends):           # two inputs: b moves the efficiency four times as far
        return 0.9 + {"low": -1, "high": 1}.get(ends.get("a"), 0) * 0.01 + \
            {"low": -1, "high": 1}.get(ends.get("b"), 0) * 0.04
    spans = planner.widest(efficiency, ["a", "b"])
    assert [name for name, _, _ in spans] == ["b", "a"]
    row = {"np": 64, "algo": "ring", "policy": "ddp", "efficiency_low": 0.82,
           "efficiency_high": 0.97}
    text = plan_report.band_text(row, [("share", 0.84, 0.95), ("inter", 0.89, 0.91)])
    assert text.startswith("At p = 64 (ring / ddp) the efficiency lies between 82 and 97 %: "
                           "mostly the residual no term explains (84.0-95.0 % with it alone")
    assert "a two-node run into --measured-efficiency narrows" in text
    assert "then the link between nodes (2.0 points)" in text


RUN = '''
[[run]]
id = "a"
set = "held-out"
model = "resnet50"
gpus = 16
ranks_per_node = 8
intra = "nvlink-v100"
inter = "25gbe"
batch = 64
samples_per_s = 400
throughput = 5120
policy = "ddp"
source = "somewhere, 2020, table 1"
'''


def test_a_published_run_gives_its_efficiency_in_any_of_three_forms(tmp_path):
    (run,) = calibration.load(write(tmp_path, RUN, "runs.toml"))
    assert run.efficiency == pytest.approx(80.0) and run.rate == Figure(400, 400, 400,
                                                                        "published")
    speedup = RUN.replace("throughput = 5120", "speedup = 12.8")
    assert calibration.load(write(tmp_path, speedup, "s.toml"))[0].efficiency == \
        pytest.approx(80.0)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("samples_per_s = 400\n", ""),
     "run 'a' has no samples_per_s (one device's rate, which the plan starts from); e.g. "
     "[[run]] id ="),
    (lambda t: t.replace("samples_per_s = 400", "samples_per_s = 400\n"
                         "samples_per_s_high = 300"), "(a range given backwards)"),
    (lambda t: t.replace("throughput = 5120", "throughput = 5120\npublished = 80"),
     "give exactly one of published"),
    (lambda t: t.replace('set = "held-out"', 'set = "test"'), "set 'test' is not one of"),
    (lambda t: t + t, "run 'a' twice"),
    (lambda t: t.replace('inter = "25gbe"', 'inter = "30gbe"'), "inter '30gbe': give a "
                                                                "preset"),
    (lambda t: "", "no [[run]] entries"),
])
def test_a_malformed_published_file_names_the_run_and_a_good_one(tmp_path, edit, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        calibration.load(write(tmp_path, edit(RUN), "runs.toml"))


def test_the_shipped_runs_have_six_disjoint_sets_each_with_its_sources():
    runs = calibration.load()
    sets = {name: [r for r in runs if r.set == name] for name in calibration.SETS}
    assert calibration.SETS == ("tuning", "held-out", "held-out-2", "held-out-3", "held-out-4",
                                "held-out-5")
    assert all(len(sets[name]) >= 6 for name in calibration.SETS)
    assert all(r.source and r.rate.value > 0 and 0 < r.efficiency <= 100 for r in runs)
    assert set(calibration.HOROVOD_SIX) <= {r.id for r in sets["tuning"]}
    # The held-out sets are others' runs: none of Horovod's own tables.
    assert not any("Horovod README" in r.source or "benchmarks.rst" in r.source
                   for r in sets["held-out"] + sets["held-out-2"] + sets["held-out-3"]
                   + sets["held-out-4"] + sets["held-out-5"])
    # Each later held-out set is fresh: no document (publisher and file) of the sets before it.
    def document(run):
        return tuple(part.split(" (")[0].strip() for part in run.source.split(",")[:2])
    seen = {document(r) for r in sets["tuning"] + sets["held-out"]}
    assert not seen & {document(r) for r in sets["held-out-2"]}
    seen |= {document(r) for r in sets["held-out-2"]}
    assert not seen & {document(r) for r in sets["held-out-3"]}
    seen |= {document(r) for r in sets["held-out-3"]}
    assert not seen & {document(r) for r in sets["held-out-4"]}
    seen |= {document(r) for r in sets["held-out-4"]}
    assert not seen & {document(r) for r in sets["held-out-5"]}
    # held-out-4 is the set that leaves the node: every run over two nodes or more.
    assert all(r.gpus > r.ranks_per_node for r in sets["held-out-4"])
    # held-out-5 has runs that leave the node, and its runs inside one stand in tables beside
    # them: half of it, at least, crosses nodes.
    crossing = sum(r.gpus > r.ranks_per_node for r in sets["held-out-5"])
    assert 2 * crossing >= len(sets["held-out-5"])


def test_the_calibrate_command_takes_every_set_by_name():
    parser = build_parser()
    for name in (*calibration.SETS, "all"):
        assert parser.parse_args(["study", "calibrate", "--set", name]).set == name
    assert parser.parse_args(["study", "calibrate"]).set == "all"


def test_scores_count_the_band_with_the_published_figures_precision():
    rows = [{"published": 80.0, "pm": 0.5, "low": 80.4, "high": 90.0, "point": 85.5},
            {"published": 70.0, "pm": 0.0, "low": 71.0, "high": 79.0, "point": 72.0}]
    for row in rows:
        row["error"], row["inside"] = row["point"] - row["published"], calibration.inside(row)
    assert [row["inside"] for row in rows] == [True, False]
    got = calibration.scores(rows)
    assert (got["inside"], got["close"], got["above"], got["below"]) == (1, 1, 2, 0)
    assert got["mean_signed"] == pytest.approx(3.75) and got["widest"] == pytest.approx(9.6)


def test_tuning_refuses_the_sets_never_tuned_against_and_chooses_the_narrowest_best_ranges():
    runs = calibration.load()
    with pytest.raises(UsageError, match="held-out-2, held-out-3, held-out-4 and held-out-5 are "
                                         "never tuned against"):
        calibration.tune_share(runs, defaults.load())
    tuning = [r for r in runs if r.set == "tuning"][:2]
    ((low, high), (most, count)), = calibration.tune_share(tuning, defaults.load()).values()
    assert count == 2 and most == 2 and low <= high
    # share_node on the one-NVLink-node runs of both sets it is chosen on; the first held-out
    # set's runs that leave a node choose nothing.
    held_out = [r for r in runs if r.set == "held-out"]
    chosen = calibration.tune_share(held_out, defaults.load())
    assert set(chosen) == {"share_node"}
    (low, high), (most, count) = chosen["share_node"]
    assert count == sum(calibration.residual_term(r) == "share_node" for r in held_out) == 4
    assert 0 <= low <= high <= low + calibration.MAX_SPAN + 1e-9 and most >= 1
    # The shipped defaults are what the command chooses.
    shipped = defaults.load().figures
    assert (shipped["share_node"].low, shipped["share_node"].high) == (low, high)


def test_horovods_six_with_planning_inputs_only_lie_inside_their_bands():
    rows = calibration.horovod_planning(defaults.load())
    assert [r["id"] for r in rows] == list(calibration.HOROVOD_SIX)
    for row in rows:
        assert row["low"] <= row["point"] <= row["high"] and row["inside"], row


def _calibrate(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "hpctrain", "study", "calibrate",
                           "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=300)


def test_the_calibration_command_prints_each_set_and_exits_2_on_a_bad_file(tmp_path):
    done = _calibrate(tmp_path, "--published", write(tmp_path, RUN, "runs.toml"))
    assert done.returncode == 0, done.stderr
    assert "## held-out (1 runs)" in done.stdout and "| a | resnet50 | 16 |" in done.stdout
    document = json.loads((tmp_path / "out" / "calibration.json").read_text())
    assert document["scores"]["held-out"]["runs"] == 1
    missing = _calibrate(tmp_path, "--defaults", str(tmp_path / "none.toml"))
    assert missing.returncode == 2 and "--defaults" in missing.stderr and \
        "e.g. an entry [slowdown]" in missing.stderr
    norate = _calibrate(tmp_path, "--published",
                        write(tmp_path, RUN.replace("samples_per_s = 400\n", ""), "bad.toml"))
    assert norate.returncode == 2 and "run 'a' has no samples_per_s" in norate.stderr


def test_the_band_narrows_as_terms_are_given():
    shipped = defaults.load().overheads()
    layers = [Layer("a", 8 << 20, 1.0)]
    cluster = step.Cluster(2, cost.Params(1e-6, 1 / 10e9, 1e-11, 5e-6, 1 / 3e9), "test")

    def width(inputs):
        rows = planner.banded(lambda end: planner.plan(
            layers, 64, 200.0, cluster, 16, ["ring"], ["horovod"], cycle_ms=0,
            overheads=inputs.at(end) if end != "point" else inputs))
        return rows[-1]["efficiency_high"] - rows[-1]["efficiency_low"]
    known = replace(shipped, share=exact(0.05), spread=exact(0.002))
    assert 0 < width(known) < width(shipped)


def test_a_plan_from_planning_inputs_alone_lists_every_default_and_its_widest_input(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hpctrain", "study", "plan", "--model",
                           "resnet50", "--samples-per-s", "329", "--batch", "32", "--ranks",
                           "16", "--ranks-per-node", "8", "--intra", "nvlink-v100", "--inter",
                           "ib-edr", "--algos", "ring", "--policies", "ddp", "--band",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "0 (not given)" not in done.stdout
    share_node = defaults.load().figures["share_node"]
    assert "- residual: 11.5 (5-18) % of compute at every p > 1 whose reductions leave the " \
           "node (default, chosen to hit published whole runs" in done.stdout
    assert f"; {share_node.describe(' %', 100)} where every reduction stays inside a node " \
           f"(default, chosen to hit published whole runs" in done.stdout
    assert "x 2.13 (1.76-2.5) where every reduction stays inside a node (default, from the " \
           "term's own measurements: A100 kernels" in done.stdout
    said = re.search(r"At p = 16 \(ring / ddp\) the efficiency lies between (\d+) and (\d+) %: "
                     r"mostly the residual no term explains", done.stdout)
    row = json.loads((tmp_path / "plan.json").read_text())["rows"][-1]
    assert said and (int(said[1]), int(said[2])) == (round(100 * row["efficiency_low"]),
                                                     round(100 * row["efficiency_high"]))
