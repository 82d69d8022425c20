"""What hidden communication still costs, on cases worked out by hand; link presets and
RATE[,LATENCY]; the band; strong scaling; bad input."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from hpctrain.collectives import cost
from hpctrain.errors import UsageError
from hpctrain.study import links, overheads, plan_report, planner, step
from hpctrain.study.overheads import Figure, Overheads, exact


@pytest.mark.parametrize("p, expected", [(1, 0.0), (2, 0.5642), (4, 1.0294), (128, 2.5946),
                                         (512, 3.0439)])
def test_the_slowest_of_p_normals(p, expected):
    assert overheads.expected_max(p) == pytest.approx(expected, abs=2e-4)


# 1 s forward, 2 s backward; one 4-byte gradient ready 1 s into backward; the channel takes
# 1 s per byte, so the ring's reduction (2 (p-1)/p x 4 bytes: 4 s at p = 2, 6 s at p = 4)
# starts beside backward and runs past its end.
CLUSTER = step.Cluster(1, cost.Params(0.0, 1.0, 0.0), "test")
GRADS = [step.Gradient("a", 4, 1.0)]


def seconds_per_byte(p):
    return cost.predict("ring", 4, p, CLUSTER.params, p, ranks_per_node=1)


def test_without_inputs_the_step_is_compute_and_exposed_communication():
    row = step.predict(GRADS, 1.0, 2.0, 2, CLUSTER, "ring", "hpctrain")
    assert row["compute_s"] == 3.0 and row["exposed_s"] == pytest.approx(
        max(0.0, 1.0 + seconds_per_byte(2) - 2.0))
    assert row["negotiation_s"] == row["slowdown_s"] == row["tail_s"] == 0
    assert row["straggler_s"] == 0 and row["step_s"] == pytest.approx(3.0 + row["exposed_s"])


def test_each_term_adds_what_its_input_says():
    ring = seconds_per_byte(4)                       # 4 bytes over 4 ranks: 6 s (2*3/4*4)
    inputs = Overheads(spread=exact(0.1), slowdown=exact(1.5), update_s=exact(0.4),
                       tensor_s=exact(0.25), rank_s=exact(0.0))
    row = step.predict(GRADS, 1.0, 2.0, 4, CLUSTER, "ring", "hpctrain", overheads=inputs)
    # One bucket, negotiated once (0.25 s): it runs 1 .. 1 + 0.25 + ring, past backward.
    assert row["exposed_s"] == pytest.approx(1.0 + ring - 2.0)
    assert row["negotiation_s"] == pytest.approx(0.25)
    # Busy 1 s of backward, reducing 0.75 s of it: negotiation slows no kernel.
    assert row["slowdown_s"] == pytest.approx(0.5 * 0.75)
    assert row["tail_s"] == pytest.approx(0.4)                  # its bytes came late
    assert row["straggler_s"] == pytest.approx(0.1 * 3.0 * overheads.expected_max(4))
    assert row["step_s"] == pytest.approx(3.0 + sum(
        row[k] for k in ("exposed_s", "negotiation_s", "slowdown_s", "tail_s", "straggler_s")))
    # DDP negotiates nothing; Horovod every tensor, per rank too.
    ddp = step.predict(GRADS, 1.0, 2.0, 4, CLUSTER, "ring", "ddp", overheads=inputs)
    assert ddp["negotiation_s"] == 0
    per_rank = Overheads(rank_s=exact(0.1))
    hvd = step.predict(GRADS, 1.0, 2.0, 4, CLUSTER, "ring", "horovod", cycle_ms=0,
                       overheads=per_rank)
    assert hvd["negotiation_s"] == pytest.approx(0.4)


def test_the_frameworks_own_work_is_fixed_seconds_per_gradient_under_each_policy():
    grads = [step.Gradient(name, 4, 1.0) for name in "abc"]
    inputs = Overheads(framework_ddp=exact(0.01), framework_hpctrain=exact(0.02),
                       framework_horovod=exact(0.0))

    def framework(p, policy, forward_s=1.0, backward_s=2.0):
        row = step.predict(grads, forward_s, backward_s, p, CLUSTER, "ring", policy,
                           cycle_ms=0, overheads=inputs)
        assert row["step_s"] == pytest.approx(sum(row[k] for k in planner.TERM_KEYS))
        return row["framework_s"], row["compute_s"]
    # One rank: one device's rate holds it. More: each policy's figure times the gradients.
    assert framework(1, "ddp")[0] == 0
    assert [framework(4, policy)[0] for policy in ("ddp", "hpctrain", "horovod")] == \
        pytest.approx([0.03, 0.06, 0.0])
    # Fixed seconds, not a share: a step half as long (mixed precision) loses twice the share.
    seconds, compute = framework(4, "ddp", 0.5, 1.0)
    assert seconds == pytest.approx(0.03) and seconds / compute == pytest.approx(2 * 0.03 / 3)
    assert inputs.framework_at("hpctrain") == exact(0.02)


def test_figures_have_ends_and_the_pessimistic_end_takes_each_cost_high():
    inputs = Overheads(spread=Figure(0.02, 0.01, 0.04), slowdown=Figure(1.1, 1.0, 1.2))
    assert inputs.uncertain and not Overheads().uncertain
    low = inputs.at("low")
    assert (low.spread.value, low.slowdown.value) == (0.04, 1.2)
    assert inputs.at("high").spread.value == 0.01
    assert overheads.figure("0.02:0.01:0.04", "--spread", "x") == Figure(0.02, 0.01, 0.04)


@pytest.mark.parametrize("text, message", [
    ("-0.1", "--spread '-0.1': must be at least 0, e.g. --spread 0.02:0.01:0.04"),
    ("a", "--spread 'a': give VALUE or VALUE:LOW:HIGH, e.g. --spread 0.02:0.01:0.04"),
    ("0.02:0.03:0.04", "LOW <= VALUE <= HIGH"),
])
def test_a_bad_figure_names_the_option_and_a_valid_example(text, message):
    with pytest.raises(UsageError, match=message):
        overheads.figure(text, "--spread", "0.02:0.01:0.04")


def test_links_by_generation_and_as_rate_and_latency():
    assert links.link("nvlink-h100", "--intra").busbw == 370e9
    assert links.link("nvlink", "--intra").name == "nvlink-v100"
    given = links.link("50gbit,5us", "--inter")
    assert (given.busbw, given.low, given.high) == (6.25e9, 6.25e9, 6.25e9)
    assert given.latency == pytest.approx(5e-6)
    assert links.link("42GB/s", "--inter").latency == links.DEFAULT_LATENCY
    for preset in links.PRESETS.values():       # every preset states its figures' source
        # (NVLink SHARP reduces in the switch: its busbw may pass the line rate, the ring's not.)
        assert preset.low <= preset.busbw <= min(preset.high, preset.line) and preset.source
    for bad in ("50gbit,5", "fast", "50gbit,-1us"):
        with pytest.raises(UsageError, match="--inter .*e.g. --inter 50gbit,5us"):
            links.link(bad, "--inter")


def test_strong_scaling_splits_the_global_batch_down_to_one_per_rank():
    assert planner.strong_counts(1024, 64) == [16, 32, 64, 128, 256, 512, 1024]
    layers = [step_layer()]
    cluster = planner.links_cluster(1, links.PRESETS["pcie3"], links.PRESETS["25gbe"])
    rows = planner.strong(layers, 1024, 64, 200.0, cluster, ["ring"], ["hpctrain"])
    assert [(r["np"], r["batch"]) for r in rows][0] == (16, 64)
    assert rows[-1]["batch"] == 1 and rows[-1]["compute_s"] == pytest.approx(1 / 200)
    assert rows[-1]["efficiency"] < rows[0]["efficiency"]
    assert planner.below_half(rows) is not None


def step_layer():
    from hpctrain.study.architectures import Layer

    return Layer("a", 100 << 20, 1.0)


def test_the_band_holds_the_point_and_rivals_within_it_are_named():
    layers = [step_layer()]
    ends = {end: planner.links_cluster(1, links.PRESETS["25gbe"].at(end),
                                    links.PRESETS["25gbe"].at(end)) for end in
            ("point", "low", "high")}
    inputs = Overheads(spread=Figure(0.01, 0.0, 0.02))
    rows = planner.banded(lambda end: planner.plan(
        layers, 64, 200.0, ends[end], 8, ["ring", "hierarchical"], ["hpctrain"],
        overheads=inputs.at(end)))
    for row in rows:
        assert row["efficiency_low"] <= row["efficiency"] <= row["efficiency_high"]
        if row["np"] > 1:       # the link's range and the spread make a band, not a point
            assert row["efficiency_low"] < row["efficiency"] < row["efficiency_high"], row
    top = planner.best(rows)[-1]
    # One node per rank: ring and hierarchical are the same allreduce, a tie named as such.
    assert "within the noise" in plan_report.choice_text(top, rows)


def test_a_measured_efficiency_leaves_a_residual_that_stays_or_grows_like_the_slowest():
    # Measured 0.5 at 2 ranks where the plan's step is all compute (3 s): 3 s unexplained,
    # a share of 1.0 of compute.
    inputs = Overheads(measured=Figure(0.5, 0.4, 0.6), measured_p=2).solved(3.0, 3.0)
    assert inputs.residual == pytest.approx(1.0)
    assert inputs.residual_s(3.0, 1) == 0                   # one rank reduces nothing
    assert inputs.residual_s(3.0, 2) == pytest.approx(3.0)  # the measured scale, at every end
    grown = overheads.expected_max(4) / overheads.expected_max(2)     # 1.8245
    assert inputs.residual_s(3.0, 4) == pytest.approx(3.0 * (1 + grown) / 2)
    low, high = (replace(inputs, end=end) for end in ("low", "high"))
    assert low.residual_s(3.0, 4) == pytest.approx(3.0 * grown)       # grows like the slowest
    assert high.residual_s(3.0, 4) == pytest.approx(3.0)              # stays
    # At the pessimistic end the measured efficiency's low figure is the one solved for.
    assert inputs.at("low").measured.value == 0.4 and inputs.at("high").measured.value == 0.6
    assert inputs.uncertain and inputs.at("low").end == "low"
    # A plan already slower than the measured run leaves nothing; none without a measurement.
    assert inputs.solved(7.0, 3.0).residual == 0
    assert Overheads().solved(7.0, 3.0).residual == 0 and not Overheads().calibrated


def test_the_plan_meets_the_measured_efficiency_at_its_scale_and_the_band_holds_it():
    from hpctrain.study.architectures import Layer

    layers = [Layer("a", 10 << 20, 1.0)]       # 0.98 at 16 ranks without a residual
    cluster = planner.links_cluster(4, links.PRESETS["pcie3"], links.PRESETS["25gbe"])
    inputs = Overheads(measured=Figure(0.9, 0.88, 0.92), measured_p=16)

    def weak(end):
        def rows(given):
            return planner.plan(layers, 64, 200.0, cluster, 64, ["ring"], ["hpctrain"],
                             overheads=given)
        return rows(planner.solved(rows, inputs.at(end) if end != "point" else inputs,
                                ("ring", "hpctrain")))
    rows = {r["np"]: r for r in planner.banded(weak)}
    assert rows[16]["efficiency"] == pytest.approx(0.9)
    assert (rows[16]["efficiency_low"], rows[16]["efficiency_high"]) == \
        (pytest.approx(0.88), pytest.approx(0.92))
    assert rows[1]["residual_s"] == 0 and rows[64]["residual_s"] > rows[16]["residual_s"]
    assert rows[64]["efficiency_low"] < rows[64]["efficiency"] < rows[64]["efficiency_high"]


def _plan(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "hpctrain", "study", "plan", "--model",
                           "resnet50", "--samples-per-s", "219", "--ranks", "16",
                           "--ranks-per-node", "4", "--algos", "ring", "--policies", "horovod",
                           "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=120)


def test_the_command_prints_every_term_the_links_and_the_band(tmp_path):
    done = _plan(tmp_path, "--intra", "pcie3", "--inter", "25gbit,10us", "--spread",
                 "0.01:0.005:0.02", "--slowdown", "1.04", "--negotiation-us", "10:7:33",
                 "--framework-us", "30:19:48",
                 "--band", "--global-batch", "1024", "--samples-per-s", "219:200:240",
                 "--measured-efficiency", "8=0.9:0.88:0.92")
    assert done.returncode == 0, done.stderr
    assert "one device 219 (200-240) samples/s" in done.stdout
    assert "- residual: efficiency 90 (88-92) % measured at 8 ranks" in done.stdout
    assert "| stragglers ms | residual ms |" in done.stdout
    assert "link pcie3: busbw 12 GB/s (10-12) of 15.8 line" in done.stdout
    assert "link 25gbit,10us: busbw 3.12 GB/s of 3.12 line, 10 µs" in done.stdout
    assert "- stragglers: spread of one rank's step 1 (0.5-2) %" in done.stdout
    assert "- negotiation: 10 (7-33) µs per negotiated tensor" in done.stdout
    assert "- framework: per gradient and step at p > 1: hpctrain 30 (19-48) µs (given " \
        "(--framework-us)); ddp 30 (19-48) µs" in done.stdout
    assert "## Strong scaling: a global batch of 1024" in done.stdout
    assert "| 16 x 64 |" in done.stdout
    document = json.loads((tmp_path / "plan.json").read_text())
    assert all(r["efficiency_low"] <= r["efficiency"] <= r["efficiency_high"]
               for r in document["rows"] + document["strong"])
    assert document["links"][1]["busbw"] == 25e9 / 8


@pytest.mark.parametrize("args, message", [
    (("--inter", "25gbit,fast"), "--inter '25gbit,fast': give a preset"),
    (("--spread", "-0.01"), "--spread '-0.01': must be at least 0"),
    (("--slowdown", "1.2:1.3:1.1"), "--slowdown '1.2:1.3:1.1': give VALUE:LOW:HIGH with "
                                     "LOW <= VALUE <= HIGH"),
    (("--global-batch", "100"), "--global-batch 100: give a multiple of --batch 64"),
    (("--measured-efficiency", "12=0.9"), "12 ranks is not a point of this plan; give one of "
                                          "2, 4, 8, 16"),
    (("--measured-efficiency", "0.9"), "give RANKS=EFFICIENCY[:LOW:HIGH] with RANKS above 1"),
    (("--measured-efficiency", "16=0.9:0.95:1"), "give an efficiency above 0 as VALUE or "
                                                 "VALUE:LOW:HIGH with LOW <= VALUE <= HIGH"),
    (("--samples-per-s", "0"), "--samples-per-s '0': give one device's samples/s above 0"),
    (("--framework-us", "48:19:30"), "--framework-us '48:19:30': give VALUE:LOW:HIGH with "
                                     "LOW <= VALUE <= HIGH"),
])
def test_bad_input_exits_2_naming_the_option_and_a_valid_example(tmp_path, args, message):
    done = _plan(tmp_path, *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "e.g." in done.stderr
