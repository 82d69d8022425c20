"""Faults during ``hpctrain train`` at np = 2: a raise anywhere, SIGKILL, a stall, NaN, a
diverged replica; a raise in ``hpctrain bench`` (np = 2) and ``hpctrain study`` (one process).
Each launch is bounded by the ``mpirun`` fixture's timeout (a hang fails); the bounds asserted
on the time from the fault to the end of the job are the promises of docs/reliability.md."""

import csv
import math
import random
import re
import sys

import pytest
import torch

from conftest import SyntheticData, assert_ended_by, launch, run_bounded, seconds_after_fault
from hpctrain import faults
from hpctrain.launch import launch_environment
from hpctrain.train import checkpoint

NP = 2
FAIL_WITHIN = 10     # s from the fault: a raise on any rank ends the job
KILL_WITHIN = 30     # s from the fault: a SIGKILLed rank ends the job
HANG = 120           # s: the fixture kills a launch that takes longer and fails the test
STEPS_PER_EPOCH = 12  # 96 training rows / (4 per rank x 2 ranks)
#: conftest's data_file: 120 rows, 96 of them for training.
DATA = SyntheticData(rows=120, shape=(1, 4, 4), classes=4, seed=3, noise=1.5)


@pytest.fixture(scope="module")
def train_cmd(data_file):
    def command(run_dir, *options):
        return [sys.executable, "-m", "hpctrain", "train", f"--data={data_file}", "--hidden=8",
                "--epochs=2", "--batch-size=4", "--allreduce=ring", "--progress=never",
                "--warmup-epochs=1", f"--run-dir={run_dir}", *options]
    return command


# --- the fault specification ------------------------------------------------------------------

def test_fault_spec_counts_hits_and_returns_other_actions(monkeypatch):
    monkeypatch.setenv(faults.ENV, "p@1#3:nan,q@*:sleep=0.01,r@0")
    faults.reset()
    assert [faults.inject("p", 1) for _ in range(4)] == [None, None, "nan", None]
    assert faults.inject("p", 0) is None
    assert faults.inject("q", 7) is None      # slept, then went on
    with pytest.raises(faults.InjectedFault, match="'r' on rank 0"):
        faults.inject("r", 0)
    faults.reset()
    monkeypatch.delenv(faults.ENV)
    assert faults.inject("p", 1) is None


HOST = """
import os, subprocess, sys, time
# Three "ranks" of one launcher (this process); rank 0 kills the host at its first step.
child = [sys.executable, "-c", "import sys, time; from hpctrain import faults; "
         "time.sleep(0.5); faults.inject('torch.step', int(sys.argv[1])); time.sleep(60)"]
ranks = [subprocess.Popen(child + [str(r)]) for r in range(3)]
codes = [rank.wait(timeout=30) for rank in ranks]
print("codes", codes)
"""


@pytest.mark.alone
def test_kill_host_ends_every_rank_the_launcher_started_and_only_those(monkeypatch):
    monkeypatch.setenv(faults.ENV, "torch.step@0:kill-host")
    done = run_bounded([sys.executable, "-c", HOST], timeout=60)
    # The launcher lives on (it is not its own sibling); all three ranks were SIGKILLed, the
    # two that never reached a fault of their own included.
    assert done.returncode == 0, done.output
    assert "codes [-9, -9, -9]" in done.output, done.output
    assert done.output.count("fires on rank 0: kill-host") == 1, done.output


# --- a rank that raises -------------------------------------------------------------------------

@pytest.mark.parametrize("fault, options", [
    ("train.start@1", []),                        # start-up, before the first broadcast
    ("train.first_step@0", []),                   # before the first forward pass
    ("train.step@1#7", []),                       # mid-epoch, after step 7 of 12
    ("train.reduce@0#3", []),                     # communication thread, in a bucket allreduce
    ("train.reduce@1#3", ["--regime=server"]),       # in a Reduce onto the parameter server
    ("train.checkpoint@0#2", ["--checkpoint-every=2 steps"]),     # rank 0 writing
    ("train.checkpoint@1#2", ["--checkpoint-every=2 steps"]),     # rank 1 passing it
    ("train.serve@0#3", ["--regime=async-server"]),   # the server, while the worker awaits it
    ("train.push@1#3", ["--regime=async-server"]),    # a worker, while the server awaits it
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_rank_that_raises_ends_the_job(mpirun, train_cmd, tmp_path, fault, options):
    run_dir = tmp_path / "run"
    run = mpirun(NP, train_cmd(run_dir, *options), timeout=HANG, env={faults.ENV: fault})
    rank = int(fault.split("@")[1][0])
    assert_ended_by(run, fault, np=NP, within=FAIL_WITHIN)
    assert "\nepoch   2/2" not in run.output
    if "checkpoint" in fault:
        # Rank 0 failing while writing the second checkpoint (step 4) leaves the first one
        # intact; when rank 1 fails there, rank 0 may still write the second.
        steps = {2} if rank == 0 else {2, 4}
        assert checkpoint.load(run_dir / "checkpoint.pt")["step"] in steps
        assert not list(run_dir.glob(".*tmp*")), "a half-written checkpoint was left behind"


@pytest.mark.parametrize("fault", [
    "bench.start@1",          # before any collective; rank 0 waits in the first one
    "bench.allreduce@0#3",    # the third round of timed calls; rank 1 is inside the first call
])
def test_a_bench_rank_that_raises_ends_the_job(mpirun, hpctrain_cmd, fault):
    run = mpirun(NP, [*hpctrain_cmd, "bench", "allreduce", "-b", "8", "-e", "1K", "-f", "4",
                      "-n", "4", "-w", "1", "--algos=ring,tree"], timeout=HANG,
                 env={faults.ENV: fault})
    assert_ended_by(run, fault, np=NP, within=FAIL_WITHIN)
    assert "# Avg bus bandwidth" not in run.output, "the benchmark went on to its end"


@pytest.mark.alone
@pytest.mark.parametrize("study", [["allreduce", "--quick"], ["train", "--quick"],
                                   ["predict", "--link=100gbit"]], ids=lambda s: s[0])
def test_a_study_that_raises_ends_with_its_traceback(hpctrain_cmd, tmp_path, study):
    # A study is one process (it refuses to run under mpirun): no MPI_Abort to wait for.
    run = run_bounded([*hpctrain_cmd, "study", *study, f"--out={tmp_path / 'out'}"],
                      timeout=HANG, env={**launch_environment(), faults.ENV: "study.start@0"})
    assert_ended_by(run, "study.start@0", np=None, within=FAIL_WITHIN)
    assert not (tmp_path / "out").exists(), "the study started although it failed"


def test_a_failure_while_writing_data_leaves_no_file(mpirun, hpctrain_cmd, tmp_path):
    out = tmp_path / "s.h5"
    run = mpirun(NP, [*hpctrain_cmd, "data", "synthetic", "--samples=10000", "--shape=8",
                      f"--out={out}"], timeout=HANG, env={faults.ENV: "data.write@0"})
    assert run.returncode != 0
    assert "InjectedFault: injected fault at 'data.write' on rank 0" in run.output
    assert seconds_after_fault(run) < FAIL_WITHIN
    assert list(tmp_path.iterdir()) == [], "a half-written data file was left behind"


# --- a rank killed with SIGKILL, and the resume -------------------------------------------------

KILL = random.Random(7)
KILL_RANK, KILL_STEP = KILL.randrange(NP), KILL.randrange(2, 2 * STEPS_PER_EPOCH)


@pytest.fixture(scope="module")
def killed(train_cmd, tmp_path_factory):
    """The uninterrupted run, and a run whose rank KILL_RANK is killed after KILL_STEP."""
    root = tmp_path_factory.mktemp("kill")
    # Its only checkpoint is the final one, which holds the weights to compare with.
    whole = launch(NP, train_cmd(root / "whole", "--checkpoint-every=1000 steps"),
                   timeout=HANG)
    assert whole.returncode == 0, whole.output
    broken = launch(NP, train_cmd(root / "broken", "--checkpoint-every=2 steps"), timeout=HANG,
                    env={faults.ENV: f"train.step@{KILL_RANK}#{KILL_STEP}:kill"})
    return root, broken


@pytest.mark.alone
def test_a_killed_rank_ends_the_job_naming_it(killed):
    _, broken = killed
    assert broken.returncode != 0, broken.output
    assert f"process rank {KILL_RANK} with PID" in broken.output, broken.output
    assert "exited on signal 9 (Killed)" in broken.output
    assert seconds_after_fault(broken) < KILL_WITHIN


@pytest.mark.alone
def test_the_last_checkpoint_before_the_kill_is_intact(killed):
    root, _ = killed
    saved = checkpoint.load(root / "broken" / "checkpoint.pt")   # checks length and SHA-256
    # Rank 0 may or may not have written the checkpoint of the step the other rank died after.
    assert saved["step"] in {(KILL_STEP - 1) // 2 * 2, KILL_STEP // 2 * 2}, saved["step"]


@pytest.mark.alone
def test_resuming_after_the_kill_reproduces_the_uninterrupted_run(killed, mpirun, train_cmd):
    root, _ = killed
    resumed = mpirun(NP, train_cmd(root / "broken", "--checkpoint-every=2 steps", "--resume"),
                     timeout=HANG)
    assert resumed.returncode == 0, resumed.output
    whole = checkpoint.load(root / "whole" / "checkpoint.pt")
    ended = checkpoint.load(root / "broken" / "checkpoint.pt")
    assert ended["step"] == whole["step"] == 2 * STEPS_PER_EPOCH
    assert all(torch.equal(ended["model"][k], whole["model"][k]) for k in whole["model"]), \
        f"killed rank {KILL_RANK} after step {KILL_STEP}: the resumed weights differ"
    # The epochs of the killed run after its checkpoint were trained again, not duplicated.
    epochs = [line.split(",")[0] for line in
              (root / "broken" / "metrics.csv").read_text().splitlines()[1:]]
    assert epochs == ["1", "2"]


# --- a stalled rank -----------------------------------------------------------------------------

def stall_messages(output, collective, late):
    """``[(seconds, aborting)]`` of each stall message about ``collective`` waiting for rank
    ``late``: the whole seconds it says it has waited, and whether it aborts the job."""
    found = re.findall(rf"\[hpctrain\] (?:warning|error): stall: {re.escape(collective)} has "
                       rf"waited (\d+) s for "
                       rf"rank\(s\) \[{late}\], which have not reached it(; aborting)?", output)
    return [(int(seconds), bool(aborting)) for seconds, aborting in found]


def test_a_stalled_rank_is_named_then_the_job_aborts(mpirun, train_cmd, tmp_path):
    # Rank 1 sleeps after step 3; rank 0 waits for it in step 4's gradient allreduce.
    run = mpirun(NP, train_cmd(tmp_path / "run", "--stall-warning=1", "--stall-timeout=3"),
                 timeout=HANG, env={faults.ENV: "train.step@1#3:sleep=100"})
    assert run.returncode != 0
    assert "aborting (stall timeout 3 s)" in run.output, run.output
    # The warning, then the abort. The watchdog rounds the seconds it waited and checks
    # every 50 ms, late on a busy machine: the warning says 1 s or a little more, before
    # the 3 s timeout; the abort at least 3 s.
    messages = stall_messages(run.output, "'step 4' (collective #5)", 1)
    assert [aborting for _, aborting in messages] == [False, True], run.output
    (warned, _), (waited, _) = messages
    assert 1 <= warned <= 3 <= waited, run.output
    assert seconds_after_fault(run) < KILL_WITHIN, run.output  # the 3 s stall timeout, then abort


def test_a_short_stall_is_named_and_the_run_goes_on(mpirun, train_cmd, tmp_path):
    run = mpirun(NP, train_cmd(tmp_path / "run", "--stall-warning=1", "--stall-timeout=0"),
                 timeout=HANG, env={faults.ENV: "train.step@0#2:sleep=2.5"})
    assert run.returncode == 0, run.output
    # Rank 0 itself is late: its watchdog thread names it while its main thread sleeps,
    # once, after the 1 s warning and before the 2.5 s sleep ends (rounded: 1 to 3 s).
    messages = stall_messages(run.output, "collective #4", 0)
    assert len(messages) == 1, run.output
    ((warned, aborting),) = messages
    assert 1 <= warned <= 3 and not aborting, run.output
    assert "\nepoch   2/2" in run.output


# --- NaN and Inf, diverged replicas -------------------------------------------------------------

@pytest.mark.parametrize("fault, message", [
    ("train.loss@1#5:nan", "non-finite loss on rank(s) [1]; non-finite gradients on rank(s) "
                           "[0, 1] at step 5 (epoch 1): stopping (--nonfinite error)"),
    ("train.grad@0#14:inf", "non-finite gradients on rank(s) [0, 1] at step 14 (epoch 2): "
                            "stopping (--nonfinite error)"),
])
def test_a_non_finite_step_stops_every_rank(mpirun, train_cmd, tmp_path, fault, message):
    run = mpirun(NP, train_cmd(tmp_path / "run"), timeout=HANG, env={faults.ENV: fault})
    assert run.returncode != 0
    assert f"NonFiniteError: {message}" in run.output, run.output
    assert seconds_after_fault(run) < FAIL_WITHIN, run.output


@pytest.mark.parametrize("value", ["inf"])    # NaN: test_a_non_finite_step_stops_every_rank
def test_skip_drops_the_update_and_finishes(mpirun, train_cmd, tmp_path, value):
    run = mpirun(NP, train_cmd(tmp_path / "run", "--nonfinite=skip"), timeout=HANG,
                 env={faults.ENV: f"train.loss@1#5:{value}"})
    assert run.returncode == 0, run.output
    assert ("non-finite loss on rank(s) [1]; non-finite gradients on rank(s) [0, 1] at step 5 "
            "(epoch 1): update skipped on every rank (--nonfinite skip; 1 skipped so far)") \
        in run.output
    assert run.output.count("update skipped") == 1, "one step skipped, reported by rank 0 once"
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [1, 2], rows
    assert all(math.isfinite(float(r[c])) for r in rows for c in ("train_loss", "val_loss")), \
        f"the skipped {value} loss was counted: {rows}"
    # The skipped step's global batch (4 rows on each rank) is left out of epoch 1's sums;
    # the step itself still counts.
    assert [int(r["samples"]) for r in rows] == [96 - NP * 4, 96], rows
    assert [int(r["steps"]) for r in rows] == [STEPS_PER_EPOCH] * 2, rows


def test_a_diverged_replica_is_an_error_naming_it(mpirun, train_cmd, tmp_path):
    run = mpirun(NP, train_cmd(tmp_path / "run", "--check-consistency=2"), timeout=HANG,
                 env={faults.ENV: "train.perturb@1#3:perturb"})
    assert run.returncode != 0
    assert ("model replicas differ at step 4 (--check-consistency 2): ranks [1] do not hold "
            "rank 0's weights") in run.output, run.output
    assert seconds_after_fault(run) < FAIL_WITHIN
