"""``study train``: its arithmetic in-process; the quick study end to end (it launches mpirun
itself), which also shows the DDP baseline taking the same steps as ``hpctrain train``."""

import json
import math
import os
import signal
import subprocess
import sys

import matplotlib.image
import pytest

from hpctrain.errors import UsageError
from hpctrain.study.train import algorithms, measured, scaling_rows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _epochs(*speeds, samples=1000.0):
    return [{"samples": samples, "epoch_s": samples / s, "samples_per_s": s, "steps": 10.0,
             "compute_s": 0.1, "exposed_comm_s": 0.0, "train_loss": 1.0} for s in speeds]


def test_warm_up_epoch_is_reported_apart_and_the_rest_pooled():
    figures = measured(_epochs(100.0, 1000.0, 500.0))
    assert figures["warmup_samples_per_s"] == 100.0
    # 2000 samples in 1 s + 2 s: the pooled rate, not the mean of the two rates (750).
    assert figures["samples_per_s"] == pytest.approx(2000 / 3)
    assert figures["measured_epochs"] == 2 and figures["steps"] == 20
    with pytest.raises(RuntimeError, match="warm-up"):
        measured(_epochs(100.0))


def test_efficiency_is_relative_to_one_rank_of_the_same_algorithm():
    histories = {("ring", 1): [_epochs(1, 100.0)], ("ring", 4): [_epochs(1, 300.0)],
                 ("ddp", 1): [_epochs(1, 50.0)],
                 ("ddp", 4): [_epochs(1, 100.0), _epochs(1, 400.0), _epochs(1, 200.0)]}
    rows = {(r["algo"], r["np"]): r for r in scaling_rows(histories, cores=2)}
    assert rows["ring", 1]["efficiency"] == 1.0
    assert rows["ring", 4]["efficiency"] == pytest.approx(300 / (4 * 100))
    # Three rounds: the best one (400) stands for the point, the median (200) beside it.
    assert rows["ddp", 4]["samples_per_s"] == pytest.approx(400.0) and rows["ddp", 4]["rounds"] == 3
    assert rows["ddp", 4]["median_samples_per_s"] == pytest.approx(200.0)
    assert rows["ddp", 4]["efficiency"] == pytest.approx(400 / (4 * 50))
    assert rows["ring", 4]["vs_ddp"] == pytest.approx(300 / 400)
    assert rows["ring", 4]["per_rank_samples_per_s"] == pytest.approx(75.0)
    assert {key: r["oversubscribed"] for key, r in rows.items()} == \
        {("ddp", 1): 0, ("ring", 1): 0, ("ddp", 4): 1, ("ring", 4): 1}


def test_the_summary_gives_the_noise_of_its_rounds_and_of_identical_code_at_one_rank():
    from hpctrain.study.train import noise_lines

    # At p = 1 ring and mpi reduce nothing: their medians (550, 440) differ by noise alone,
    # 25 %; horovod and ddp run other code there and are left out of that comparison.
    histories = {("ring", 1): [_epochs(1, 500.0), _epochs(1, 550.0), _epochs(1, 600.0)],
                 ("mpi", 1): [_epochs(1, 440.0), _epochs(1, 400.0), _epochs(1, 480.0)],
                 ("horovod", 1): [_epochs(1, 900.0), _epochs(1, 900.0), _epochs(1, 900.0)],
                 ("ddp", 1): [_epochs(1, 100.0), _epochs(1, 100.0), _epochs(1, 100.0)]}
    rows = scaling_rows(histories, cores=2)
    spread = {r["algo"]: r["spread"] for r in rows}
    assert spread == pytest.approx({"ring": 100 / 550, "mpi": 80 / 440, "horovod": 0.0,
                                    "ddp": 0.0})
    text = "\n".join(noise_lines(rows))
    assert "the rounds of a point spread by 0 to 18 %" in text, text
    assert "At p = 1 mpi, ring run the same code" in text, text
    assert "the median of ring is 25 % above mpi's" in text, text
    # One round and one algorithm of ours: nothing to say.
    assert noise_lines(scaling_rows({("ring", 1): [_epochs(1, 500.0)]}, cores=2)) == []


def test_unknown_algorithm_names_the_valid_ones():
    assert algorithms("ring, ddp,ring") == ["ring", "ddp"]
    with pytest.raises(UsageError, match="unknown nccl.*horovod.*ddp"):
        algorithms("ring,nccl")


def test_gloo_is_pointed_at_the_interface_that_routes_to_the_store():
    from hpctrain.torch.ddp import _interface_reaching, interface_addresses

    loopback = [name for name, address in interface_addresses().items()
                if address == "127.0.0.1"]
    assert loopback and _interface_reaching("127.0.0.1") == loopback[0]


def _run_study(argv, timeout):
    # --launch-timeout ends a hung launch first; this timeout ends a study that hangs itself.
    proc = subprocess.Popen([sys.executable, "-m", "hpctrain", "study", "train", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"study train did not finish within {timeout} s:\n{proc.communicate()[0]}")
    return proc.returncode, output


@pytest.mark.alone
def test_quick_study_writes_consistent_numbers_and_plots(tmp_path):
    # --batch-size 720: the digits' 1437 training rows make 2 steps per epoch at p = 1 and
    # one at p = 2, so that the runs at p = 2 also show the losses of single steps (below);
    # no warm-up of the learning rate, so that the first update moves the loss visibly.
    out = tmp_path / "report"
    code, output = _run_study(["--quick", "--allreduce", "ring,ddp", "--batch-size", "720",
                               "--set", "warmup_epochs=0", "--set", "lr=0.02",
                               "--launch-timeout", "90", "--out", str(out),
                               "--tensorboard", str(tmp_path / "tb")], timeout=200)
    assert code == 0, output
    # Every run's event files, in a folder of its own, hold its metrics.csv.
    from test_train_tensorboard import assert_same_figures, events, metrics

    for name in ("ring-p1-r1", "ring-p2-r1", "ddp-p1-r1", "ddp-p2-r1"):
        assert_same_figures(events(tmp_path / "tb" / name), metrics(out / "runs" / name))
    result = json.loads((out / "train.json").read_text())
    rows = {(r["algo"], r["np"]): r for r in result["rows"]}
    assert set(rows) == {("ring", 1), ("ring", 2), ("ddp", 1), ("ddp", 2)}
    cores = result["cores"]
    for (algo, p), r in rows.items():
        assert r["samples_per_s"] > 0 and r["warmup_samples_per_s"] > 0
        assert r["efficiency"] == pytest.approx(
            r["samples_per_s"] / (p * rows[algo, 1]["samples_per_s"]))
        assert r["vs_ddp"] == pytest.approx(r["samples_per_s"] / rows["ddp", p]["samples_per_s"])
        assert r["oversubscribed"] == int(p > cores)
    assert rows["ring", 1]["efficiency"] == rows["ddp", 1]["efficiency"] == 1.0
    epochs = {}
    for run in result["runs"]:
        mine, p = run["epochs"], run["np"]
        epochs[run["algo"], p] = mine
        assert len(mine) == 2          # --quick: one warm-up epoch, one measured
        # Weak scaling: every step of every run reads 720 samples per rank (padding included).
        assert [e["steps"] for e in mine] == [2 // p] * 2
        assert all(e["samples"] == e["steps"] * 720 * p for e in mine)
        point = rows[run["algo"], p]
        assert point["samples_per_s"] == pytest.approx(mine[1]["samples"] / mine[1]["epoch_s"])
        assert point["warmup_samples_per_s"] == mine[0]["samples_per_s"]
    for name in ("samples_per_s_vs_p.png", "efficiency_vs_p.png"):
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] > 200 and image.shape[1] > 300 and image.std() > 0
    summary = (out / "summary.md").read_text()
    assert f"- machine: {cores} cores" in summary
    for algo, p in rows:
        assert f"| {p}{'*' if p > cores else ''} | {algo} |" in summary
    _same_steps(epochs["ring", 2], epochs["ddp", 2])


def _same_steps(ring, ddp):
    # At p = 2, epoch k is step k. Step 1 runs before any update: the same initial weights
    # and the same rows give the same loss (both sum the ranks' losses in float64, so only
    # printing rounds them). Step 2 follows one update: the same averaged gradient,
    # optimizer and learning rate give the same loss up to the order in which the float32
    # gradients were summed (hpctrain's ring and gloo differ).
    assert [e["lr"] for e in ddp] == [e["lr"] for e in ring]
    assert ddp[0]["train_loss"] == pytest.approx(ring[0]["train_loss"], rel=1e-6)
    assert ddp[1]["train_loss"] == pytest.approx(ring[1]["train_loss"], rel=1e-4)
    # ... and the update did move the loss: step 2 is not a copy of step 1.
    assert not math.isclose(ring[0]["train_loss"], ring[1]["train_loss"], rel_tol=1e-3)


def test_a_tensorboard_folder_that_cannot_be_written_stops_the_study_before_it_launches(
        tmp_path):
    (tmp_path / "file").write_text("")
    code, output = _run_study(["--quick", "--out", str(tmp_path / "report"), "--tensorboard",
                               str(tmp_path / "file" / "tb")], timeout=60)
    assert code == 2 and f"{tmp_path / 'file'} is not a folder" in output, output
    assert not (tmp_path / "report").exists()


def test_study_train_refuses_to_run_under_mpirun(mpirun, hpctrain_cmd):
    result = mpirun(2, [*hpctrain_cmd, "study", "train", "--quick"], timeout=60)
    assert result.returncode == 2
    assert "run it as one process" in result.output


def _batch_args(strong=False, global_batch=None, batch_size=32, given=False):
    from types import SimpleNamespace

    return SimpleNamespace(strong=strong, global_batch=global_batch, batch_size=batch_size,
                           batch_size_given=given)


def test_strong_scaling_splits_the_global_batch_over_the_ranks():
    from hpctrain.study.train import batch_per_rank, check_batches

    strong = _batch_args(strong=True, global_batch=96)
    check_batches(strong, [1, 2, 3, 4])
    assert [batch_per_rank(strong, p) for p in (1, 2, 3, 4)] == [96, 48, 32, 24]
    weak = _batch_args(batch_size=8)
    check_batches(weak, [1, 2, 3])
    assert [batch_per_rank(weak, p) for p in (1, 2, 3)] == [8, 8, 8]


@pytest.mark.parametrize("args, message", [
    (_batch_args(strong=True, global_batch=100), r"does not split evenly over p = 3: give a "
                                                 r"multiple of 12"),
    (_batch_args(strong=True), r"--strong .* give --global-batch B"),
    (_batch_args(strong=True, global_batch=0), r"--global-batch B \(B >= 1"),
    (_batch_args(strong=True, global_batch=96, given=True), r"drop --batch-size"),
    (_batch_args(global_batch=96), r"--global-batch is for strong scaling: add --strong"),
])
def test_strong_scaling_options_that_do_not_fit_are_refused(args, message):
    from hpctrain.study.train import check_batches

    with pytest.raises(UsageError, match=message):
        check_batches(args, [1, 2, 3, 4])


def test_the_summary_says_which_scaling_and_each_points_batch():
    from hpctrain.study.train import summary

    rows = scaling_rows({("ring", 1): [_epochs(1, 100.0)], ("ring", 2): [_epochs(1, 150.0)]}, 2)
    for row in rows:
        row["batch_per_rank"] = 96 // row["np"]
    settings = {"model": "mlp", "batch_size": 32, "scaling": "strong", "global_batch": 96,
                "epochs": 2, "max_steps": 0, "set": [], "rounds": 1, "launcher": "local"}
    text = summary(rows, settings, 2, {"mpi": "Open MPI", "versions": {"hpctrain": "0"}})
    assert "# Training scaling study (strong scaling)" in text
    assert "global batch 96 at every p, 96 / p per rank" in text
    assert "| 2 | ring | 48 | 150 |" in text
