"""study plan with the compute measured here: forward, backward and each layer's gradient as
backward hands it over, in place of one device's samples/s spread by multiply-adds."""

import json
import subprocess
import sys

import pytest
import torch

from hpctrain.collectives import cost
from hpctrain.errors import UsageError
from hpctrain.study import compute, planner, step
from hpctrain.study.architectures import Layer


def test_measured_gradients_come_in_the_order_and_at_the_times_backward_had_them():
    layers = [Layer("a", 100, 9.0), Layer("b", 200, 1.0), Layer("c", 300, 1.0)]
    measured = compute.Compute(batch=8, steps=1, forward_s=0.2, backward_s=0.5,
                               ready={"c": 0.1, "b": 0.3})
    grads = step.measured_gradients(layers, measured)
    # Not by multiply-adds: as measured; "a" got no gradient, so it counts at backward's end.
    assert [(g.name, g.nbytes, g.ready) for g in grads] == [("c", 300, 0.1), ("b", 200, 0.3),
                                                            ("a", 100, 0.5)]


def test_a_measured_step_puts_the_one_bucket_after_the_last_gradient():
    # One bucket holds all 600 bytes; it is ready when "a" is, at backward's end (0.5 s), so
    # its whole reduction is exposed: step = forward + backward + one ring over 2 ranks.
    layers = [Layer("a", 100, 0.0), Layer("b", 200, 0.0), Layer("c", 300, 0.0)]
    measured = compute.Compute(8, 1, 0.2, 0.5, {"c": 0.1, "b": 0.3, "a": 0.5})
    cluster = planner.nominal_cluster(2, "10gbe", "10gbe")
    rows = planner.plan(layers, 8, None, cluster, 2, ["ring"], ["hpctrain"], (1.0,),
                     compute=measured)
    one, two = rows
    assert one["step_s"] == pytest.approx(0.7) and one["exposed_s"] == 0.0
    ring = cost.predict("ring", 600, 2, cluster.params, 1, ranks_per_node=2)
    assert two["exposed_s"] == pytest.approx(ring)
    assert two["step_s"] == pytest.approx(0.7 + ring)
    assert two["efficiency"] == pytest.approx(0.7 / (0.7 + ring))


def test_measure_times_a_real_model_and_leaves_no_hook_behind():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    measured = compute.measure(model, (16,), batch=8, steps=2)
    assert set(measured.ready) == {"0", "2"}
    assert measured.forward_s > 0 and measured.backward_s > 0
    # The last layer's gradient is accumulated first, and every one within backward.
    assert 0 <= measured.ready["2"] <= measured.ready["0"] <= measured.backward_s
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())


def test_measure_refuses_an_empty_batch():
    with pytest.raises(UsageError, match="batch and steps of at least 1"):
        compute.measure(torch.nn.Linear(2, 2), (2,), batch=0)


def _plan(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "hpctrain", "study", "plan", "--model", "mlp",
                           "--input", "1,8,8", "--batch", "16", "--ranks", "8",
                           "--ranks-per-node", "4", "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=120)


def test_the_command_measures_compute_and_records_it(tmp_path):
    done = _plan(tmp_path, "--measure-compute", "--measure-steps", "2")
    assert done.returncode == 0, done.stderr
    assert "compute measured here (median of 2 steps)" in done.stdout
    recorded = json.loads((tmp_path / "plan.json").read_text())
    measured = recorded["compute"]
    assert measured["batch"] == 16 and measured["steps"] == 2
    assert set(measured["ready"]) == {layer["name"] for layer in recorded["layers"]}
    assert recorded["samples_per_s"] == pytest.approx(
        16 / (measured["forward_s"] + measured["backward_s"]))


def test_the_command_takes_one_source_of_compute(tmp_path):
    both = _plan(tmp_path, "--measure-compute", "--samples-per-s", "100")
    assert both.returncode == 2 and "not both" in both.stderr
    neither = _plan(tmp_path)
    assert neither.returncode == 2 and "or --measure-compute" in neither.stderr
