"""Checkpoints: checksum, truncation and corruption detected, the last K kept, ``--resume
auto`` falling back to the newest intact one (in-process, and at np = 2 under mpirun)."""

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from mpi4py import MPI

from hpctrain.train import TrainConfig, checkpoint, train
from hpctrain.train.checkpoint import CheckpointError

from conftest import SyntheticData


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def corrupt(path):
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01  # one bit inside the payload
    path.write_bytes(bytes(data))


DAMAGE = {"truncated": (truncate, "is truncated: it holds"),
          "corrupted": (corrupt, "is corrupted: its SHA-256 differs")}


def test_save_and_load_round_trip(tmp_path):
    path = checkpoint.save(tmp_path / "c.pt", {"step": 3, "w": torch.arange(4.0)})
    state = checkpoint.load(path)
    assert state["step"] == 3 and torch.equal(state["w"], torch.arange(4.0))


@pytest.mark.parametrize("damage", DAMAGE)
def test_damage_is_detected(tmp_path, damage):
    path = checkpoint.save(tmp_path / "c.pt", {"step": 3, "w": torch.zeros(1000)})
    spoil, message = DAMAGE[damage]
    spoil(path)
    with pytest.raises(CheckpointError, match=message):
        checkpoint.load(path)


def test_other_files_are_not_checkpoints(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"step": 1}, path)  # a plain torch file: no header, no checksum
    with pytest.raises(CheckpointError, match="is not an hpctrain checkpoint"):
        checkpoint.load(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.load(tmp_path / "none.pt")


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_the_last_k_are_kept_newest_first(tmp_path, keep):
    path = tmp_path / "checkpoint.pt"
    for step in range(5):
        checkpoint.save(path, {"step": step}, keep=keep)
    kept = checkpoint.history(path)
    assert [p.name for p in kept] == ["checkpoint.pt"] + [f"checkpoint.{i}.pt"
                                                          for i in range(1, keep)]
    assert [checkpoint.load(p)["step"] for p in kept] == list(range(4, 4 - keep, -1))


@pytest.mark.parametrize("keep", [2, 3])
def test_a_crash_before_the_new_one_is_published_leaves_checkpoint_pt(tmp_path, monkeypatch,
                                                                       keep):
    path = tmp_path / "checkpoint.pt"
    for step in (1, 2):
        checkpoint.save(path, {"step": step}, keep=keep)
    replace = os.replace

    def crash_on_publish(src, dst):
        # The rename of the new, complete checkpoint onto checkpoint.pt: the rotation of the
        # older ones has happened, the publication has not.
        if Path(dst) == path and Path(src).name.startswith(".checkpoint.pt.tmp"):
            raise OSError("crashed before publishing")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_publish)
    with pytest.raises(OSError, match="crashed before publishing"):
        checkpoint.save(path, {"step": 3}, keep=keep)
    monkeypatch.undo()
    assert checkpoint.load(path)["step"] == 2
    assert [checkpoint.load(p)["step"] for p in checkpoint.history(path)] == [2, 2, 1][:keep]
    assert set(tmp_path.iterdir()) == set(checkpoint.history(path)), "a temporary file is left"
    # The next save goes on as usual, and the older copies are files of their own.
    checkpoint.save(path, {"step": 4}, keep=keep)
    assert [checkpoint.load(p)["step"] for p in checkpoint.history(path)] == [4, 2, 2][:keep]


@pytest.mark.parametrize("damage", DAMAGE)
def test_resume_auto_skips_a_damaged_checkpoint_and_says_so(tmp_path, damage):
    path = tmp_path / "checkpoint.pt"
    for step in (1, 2, 3):
        checkpoint.save(path, {"step": step}, keep=3)
    DAMAGE[damage][0](path)
    said = []
    found, state = checkpoint.find("auto", tmp_path, log=said.append)
    assert found.name == "checkpoint.1.pt" and state["step"] == 2
    assert DAMAGE[damage][1] in said[0] and "previous intact checkpoint" in said[1]


def test_resume_auto_with_every_checkpoint_damaged_is_an_error(tmp_path):
    path = tmp_path / "checkpoint.pt"
    for step in (1, 2):
        checkpoint.save(path, {"step": step}, keep=2)
    for p in checkpoint.history(path):
        corrupt(p)
    with pytest.raises(CheckpointError, match="no intact checkpoint in .*start afresh"):
        checkpoint.find("auto", tmp_path, log=lambda text: None)
    with pytest.raises(CheckpointError, match="--resume: checkpoint .* is corrupted"):
        checkpoint.find(str(path), tmp_path)
    assert checkpoint.find("auto", tmp_path / "empty") == (None, None)  # nothing: fresh


# --- whole runs ---------------------------------------------------------------------------------

#: conftest's data_file: 160 training rows, 10 steps per epoch of batch 16.
DATA = SyntheticData(rows=200, shape=(1, 4, 4), classes=4, seed=5, noise=2.0)


@pytest.fixture
def config(data_file, tmp_path):
    return TrainConfig(data=str(data_file), run_dir=str(tmp_path / "run"), hidden=12,
                       epochs=3, batch_size=16, allreduce="ring", progress="never",
                       warmup_epochs=1, checkpoint_every="0")


def test_resume_from_the_previous_checkpoint_reproduces_the_run(config, capsys):
    whole = train(config, MPI.COMM_SELF)
    # 10 steps per epoch; checkpoints at 4, 8, ..., 20; stopped at 22; the newest is damaged.
    broken = dataclasses.replace(config, run_dir=config.run_dir + "-broken",
                                 checkpoint_every="4 steps", max_steps=22, keep_checkpoints=3)
    train(broken, MPI.COMM_SELF)
    corrupt(broken.run_path / "checkpoint.pt")
    capsys.readouterr()
    resumed = train(dataclasses.replace(broken, max_steps=0, resume="auto"), MPI.COMM_SELF)
    err = capsys.readouterr().err
    assert "skipping a damaged checkpoint" in err and "checkpoint.1.pt" in err
    assert resumed.step == whole.step
    assert all(torch.equal(resumed.state[k], whole.state[k]) for k in whole.state)
    epochs = [r.split(",")[0] for r in (broken.run_path / "metrics.csv").read_text().split()[1:]]
    assert epochs == ["1", "2", "3"]   # epoch 3's row of the broken run was dropped, not doubled


@pytest.mark.parametrize("damage", DAMAGE)
def test_two_ranks_resume_from_the_previous_intact_checkpoint(mpirun, hpctrain_cmd, data_file,
                                                              tmp_path, damage):
    options = [*hpctrain_cmd, "train", f"--data={data_file}", "--hidden=12", "--epochs=2",
               "--batch-size=8", "--allreduce=ring", "--progress=never",
               f"--run-dir={tmp_path}", "--checkpoint-every=4 steps", "--keep-checkpoints=2"]
    first = mpirun(2, [*options, "--max-steps=10"], timeout=120)   # checkpoints at 4, 8, 10
    assert first.returncode == 0, first.output
    first_step = checkpoint.load(tmp_path / "checkpoint.1.pt")["step"]
    DAMAGE[damage][0](tmp_path / "checkpoint.pt")
    resumed = mpirun(2, [*options, "--resume"], timeout=120)
    assert resumed.returncode == 0, resumed.output
    assert DAMAGE[damage][1] in resumed.output
    assert (f"resuming from the previous intact checkpoint '{tmp_path / 'checkpoint.1.pt'}'"
            in resumed.output)
    assert f"at epoch {first_step // 10 + 1}, step {first_step})" in resumed.output
    assert resumed.output.count("skipping a damaged checkpoint") == 1, "only rank 0 reports"
    # The fallback costs one more checkpoint read, and no rank waits on a timeout: the resumed
    # launch (the steps from the previous checkpoint to 20) does about the first one's work
    # (10 steps) after the same start-up. A ratio, since both ran side by side: 3x leaves
    # room for a busy machine's noise; a wait of the kind a timeout gives would exceed it.
    assert resumed.elapsed < 3 * first.elapsed, \
        f"first launch {first.elapsed:.1f} s, resumed {resumed.elapsed:.1f} s"
