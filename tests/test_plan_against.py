"""``study plan --against``: the prediction of a measured train run on cases worked out by
hand (a fake train.json, params.json and data file), and bad input."""

import json
import subprocess
import sys

import numpy as np
import pytest

from hpctrain.collectives import cost
from hpctrain.data import write_arrays
from hpctrain.errors import UsageError
from hpctrain.study import plan_against, planner, step

# One millisecond per message, 10 µs per byte, nothing per byte reduced: a 200-byte ring
# allreduce at p = 2 takes 2 messages (2 ms) and 200 bytes on a link (2 ms).
PARAMS = {"fitted": {"alpha": 1e-3, "beta": 1e-5, "gamma": 0.0},
          "p2p_prior": {"alpha": 1e-3, "beta": 1e-5, "gamma": 0.0}, "ranks_per_node": 1}


def write_data(tmp_path):
    # Samples of 1x2x2 and 2 classes: the mlp with hidden=4 has layers of 4*4+4, 4*4+4 and
    # 4*2+2 parameters: 80, 80 and 40 bytes of gradients, 200 in all.
    path = tmp_path / "data.h5"
    x = np.zeros((20, 1, 2, 2), np.float32)
    write_arrays(str(path), x, np.arange(20) % 2, classes=2, source="test")
    return path


def point(algo, p, samples_per_s, batch, step_s=0.010, compute_s=0.008, **extra):
    # Two measured epochs of 5 steps each: compute_s is per epoch, so per step it is / 5.
    return {"algo": algo, "np": p, "samples_per_s": samples_per_s, "batch_per_rank": batch,
            "oversubscribed": int(p > 2), "measured_epochs": 2, "steps": 10,
            "step_s": step_s, "compute_s": 5 * compute_s, "exposed_comm_s": 0.0, **extra}


def write_train(tmp_path, rows, scaling="weak", model="mlp", name="train", bucket_mb=25):
    folder = tmp_path / name
    folder.mkdir()
    data = write_data(tmp_path)
    settings = {"model": model, "scaling": scaling, "batch_size": 8,
                "set": [f"data={data}", "hidden=4", f"bucket_mb={bucket_mb}"]}
    (folder / "train.json").write_text(json.dumps({"settings": settings, "cores": 2,
                                                   "rows": rows}))
    return folder


def write_params(tmp_path, params=PARAMS):
    path = tmp_path / "params.json"
    path.write_text(json.dumps(params))
    return path


def against(tmp_path, *folders, params=None, extra=()):
    return subprocess.run([sys.executable, "-m", "hpctrain", "study", "plan",
                           *(f"--against={f}" for f in folders),
                           "--params", str(params or write_params(tmp_path)),
                           "--out", str(tmp_path / "out"), *extra],
                          capture_output=True, text=True, timeout=120)


def test_the_training_models_have_their_layers():
    layers, shape = planner.model_layers("mlp", (1, 2, 2), classes=2, hidden=4)
    assert shape == (1, 2, 2)
    assert [(layer.nbytes, layer.macs) for layer in layers] == [(80, 16), (80, 16), (40, 8)]
    wide, _ = planner.model_layers("wide", (1, 8, 8), classes=10, model_mb=4)
    assert len(wide) == 5
    assert sum(layer.nbytes for layer in wide) == pytest.approx(4 * 2**20, rel=0.01)


def rows_of(tmp_path, measured, scaling="weak", params=PARAMS, ranks_per_node=1):
    document = json.loads((write_train(tmp_path, measured, scaling) / "train.json").read_text())
    config = plan_against.train_config(document["settings"])
    layers = plan_against.train_layers(config)
    cluster = step.Cluster(ranks_per_node, cost.params_of(params), "test")
    return plan_against.compare(document, layers, cluster, config.bucket_mb, config.overlap)


def test_weak_scaling_adds_the_exposed_reduction_to_the_step_at_one_rank(tmp_path):
    # p = 2: the 200 bytes are one 25 MB bucket, ready at the end of backward, so the whole
    # ring (4 ms) is exposed: step 10 + 4 = 14 ms, 2 ranks x 8 samples / 14 ms = 1142.9/s.
    # p = 4 on 2 cores: the step at one rank takes twice as long (20 ms); the ring at p = 4
    # over 4 nodes: 6 messages (6 ms) and 2*200*3/4 = 300 bytes (3 ms): 29 ms in all,
    # 4 x 8 / 29 ms = 1103.4/s.
    rows = rows_of(tmp_path, [point("ring", 1, 800, 8), point("ring", 2, 1000, 8),
                              point("ring", 4, 800, 8), point("horovod", 2, 900, 8)])
    assert [(r["np"], r["algo"]) for r in rows] == [(2, "ring"), (4, "ring")]
    two, four = rows
    assert two["predicted_step_s"] == pytest.approx(0.014)
    assert two["predicted_exposed_s"] == pytest.approx(0.004)
    assert two["predicted"] == pytest.approx(16 / 0.014)
    assert two["error"] == pytest.approx(16 / 0.014 / 1000 - 1) and two["within"]
    assert four["predicted_step_s"] == pytest.approx(0.029)
    assert four["predicted"] == pytest.approx(32 / 0.029)
    assert not four["within"] and four["oversubscribed"]


def test_strong_scaling_scales_the_step_with_the_batch_per_rank(tmp_path):
    # Global batch 16: 16 per rank at p = 1 (20 ms), 8 at p = 2: 10 ms + the 4 ms ring.
    rows = rows_of(tmp_path, [point("ring", 1, 800, 16, step_s=0.020, compute_s=0.016),
                              point("ring", 2, 1000, 8)], scaling="strong")
    assert rows[0]["scaling"] == "strong"
    assert rows[0]["predicted_compute_s"] == pytest.approx(0.010)
    assert rows[0]["predicted_step_s"] == pytest.approx(0.014)


def test_a_reduction_during_backward_is_hidden(tmp_path):
    # Buckets of at most 100 bytes: 40, 80 and 80 (the layers in backward order). Backward
    # takes 2/3 of the 8 ms compute per step, 5.33 ms, shared by multiply-adds (8, 16, 16 of
    # 40): the buckets are ready at 1.07, 3.2 and 5.33 ms. Each ring takes 2 ms + 10 µs/B:
    # 2.4, 2.8, 2.8 ms, one after the other from 1.07 ms (the channel is busy past 3.2 and
    # 5.33), ending at 9.07 ms: 3.73 ms exposed. Without overlap all 8 ms are.
    folder = write_train(tmp_path, [point("ring", 1, 800, 8), point("ring", 2, 1000, 8)],
                         bucket_mb=100 / 2**20)
    document = json.loads((folder / "train.json").read_text())
    config = plan_against.train_config(document["settings"])
    layers = plan_against.train_layers(config)
    cluster = step.Cluster(1, cost.params_of(PARAMS), "test")
    grads = step.gradients(layers, 2 * 0.008 / 3)
    buckets = step.buckets(grads, 100)
    assert [b[0] for b in buckets] == [40, 80, 80]
    row = plan_against.compare(document, layers, cluster, config.bucket_mb)[0]
    end = 0.008 * 2 / 3 * 8 / 40 + 0.0024 + 0.0028 + 0.0028
    assert row["predicted_exposed_s"] == pytest.approx(end - 0.008 * 2 / 3)
    unhidden = plan_against.compare(document, layers, cluster, config.bucket_mb,
                                    overlap=False)[0]
    assert unhidden["predicted_exposed_s"] == pytest.approx(0.0024 + 0.0028 + 0.0028)


def test_two_nodes_charge_the_hierarchical_phase_between_them(tmp_path):
    # 2 nodes of 2 ranks, α' = 2 ms and β' = 20 µs/B between nodes: the hierarchical
    # allreduce costs (2, 200, 150, 2, 200) = 2 + 2 + 4 + 4 = 12 ms at p = 4.
    params = {"fitted": dict(PARAMS["fitted"], alpha_inter=2e-3, beta_inter=2e-5),
              "p2p_prior": PARAMS["p2p_prior"]}
    rows = rows_of(tmp_path, [point("hierarchical", 1, 800, 8),
                              point("hierarchical", 4, 1000, 8)], params=params,
                   ranks_per_node=2)
    assert rows[0]["nodes"] == 2
    assert rows[0]["predicted_exposed_s"] == pytest.approx(0.012)
    assert rows[0]["predicted_step_s"] == pytest.approx(0.020 + 0.012)


def test_the_command_writes_the_table_and_a_verdict_per_point(tmp_path):
    weak = write_train(tmp_path, [point("ring", 1, 800, 8), point("ring", 2, 1000, 8),
                                  point("ring", 4, 800, 8)])
    result = against(tmp_path, weak)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "out" / "against.md").read_text()
    assert "| weak | 2 | ring | 8 | 2 | 1143 | 1000 | +14.3 % |" in text
    assert "| weak | 4* | ring | 8 | 4 | 1103 | 800 | +37.9 % |" in text
    assert "MISSES 15 %" in text and "1 of 2 points within 15%" in text
    document = json.loads((tmp_path / "out" / "against.json").read_text())
    assert [r["within"] for r in document["rows"]] == [True, False]


def test_bad_input_exits_2_naming_what_would_be_right(tmp_path):
    weak = write_train(tmp_path, [point("ring", 1, 800, 8), point("ring", 2, 1000, 8)])
    missing = against(tmp_path, weak, params=tmp_path / "nowhere.json")
    assert missing.returncode == 2 and "study allreduce" in missing.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    no_train = against(tmp_path, empty)
    assert no_train.returncode == 2 and "no train.json there" in no_train.stderr
    other = against(tmp_path, weak, extra=("--model", "wide"))
    assert other.returncode == 2
    assert "trained --model mlp, not wide: give --model mlp" in other.stderr
    one_node = against(tmp_path, weak, params=write_params(
        tmp_path, dict(PARAMS, ranks_per_node=0)))
    assert one_node.returncode == 2 and "give --ranks-per-node S" in one_node.stderr


def test_a_run_without_its_one_rank_point_is_refused(tmp_path):
    with pytest.raises(UsageError, match="no p = 1 point of tree"):
        rows_of(tmp_path, [point("ring", 1, 800, 8), point("tree", 2, 1000, 8)])
