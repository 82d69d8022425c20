"""Bad input to ``hpctrain train`` at np = 2: a message naming the problem and what is valid,
exit status 2 within 10 s, no hang, and nothing written to the run directory.

Bad allreduce calls (different sizes on different ranks, non-contiguous tensors) are tested
where the collectives live, under mpirun at np = 1..4: tests/mpi/test_collectives.py
(``test_different_lengths_raise_on_every_rank``, ``test_non_contiguous_input_names_the_fix``).
``--allreduce=rign`` is tests/test_train_loop.py's ``test_bad_option_ends_every_rank_with_status_2``.
"""

import dataclasses

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.data import synthetic, write_arrays
from hpctrain.train import TrainConfig, train

NP = 2
WITHIN = 10  # s
HANG = 120   # s: the mpirun fixture kills a launch that takes longer and fails the test


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    good = synthetic.write(root / "good.h5", 40, (1, 4, 4), 4, seed=1)
    (root / "text.h5").write_text("x,y\n1,2\n")
    with h5py.File(root / "uneven.h5", "w") as f:
        f["x"], f["y"] = np.zeros((10, 4), np.float32), np.zeros(9, np.int64)
    with h5py.File(root / "empty.h5", "w") as f:
        f["x"], f["y"] = np.zeros((0, 4), np.float32), np.zeros(0, np.int64)
    write_arrays(root / "one.h5", np.zeros((1, 4)), np.zeros(1), classes=2)
    (root / "typo.toml").write_text('epochs = 1\nlearning_rate = 0.1\n')
    # A checkpoint of the MLP with --hidden 16, written by 1 rank after 1 step (mid-epoch).
    config = TrainConfig(data=str(good), run_dir=str(root / "ckpt"), hidden=16, epochs=1,
                         batch_size=4, max_steps=1, checkpoint_every="1 steps",
                         allreduce="ring", progress="never")
    train(config, MPI.COMM_SELF)
    return root


CASES = {
    "missing file": (["--data={root}/nothing.h5"],
                     "data file '{root}/nothing.h5' does not exist (prepare one with"),
    "not HDF5": (["--data={root}/text.h5"],
                 "is not a readable HDF5 file (", "--data needs an HDF5 file with samples"),
    "wrong dataset names": (["--x=images", "--y=labels"],
                            "has no dataset 'images' (option 'x'); it holds: x, y"),
    "x and y of different lengths": (["--data={root}/uneven.h5"],
                                     "samples /x (10, 4) and labels /y (9,) must be (rows, ...) "
                                     "and (rows,) with equal rows"),
    "empty data set": (["--data={root}/empty.h5"],
                       "holds no samples: /x and /y have 0 rows; training needs at least one"),
    "no training rows": (["--data={root}/one.h5", "--val-fraction=0.6"],
                         "--val-fraction 0.6 leaves no training rows"),
    "fewer samples than ranks x batch": (["--batch-size=20", "--drop-last"],
                                         "drop_last with 32 samples leaves no batch: the global "
                                         "batch (20 × 2 ranks) must be <= 32"),
    "unknown model": (["--model=resnet"], "model: 'resnet' is not one of mlp, cnn, wide"),
    "unknown regime": (["--regime=gossip"],
                       "regime: 'gossip' is not one of allreduce, ps, ps-sharded, async-ps"),
    "unknown option": (["--epoch=3"], "unknown configuration key 'epoch' on the command line; "
                                      "valid keys: name, run_dir"),
    "zero batch size": (["--batch-size=0"], "batch_size must be >= 1, got 0"),
    "negative hidden width": (["--hidden=-4"], "hidden must be >= 1, got -4"),
    "zero bucket size": (["--bucket-mb=0"], "bucket_mb must be > 0, got 0.0"),
    "misspelled key in a config file": (["--config={root}/typo.toml"],
                                        "unknown configuration key 'learning_rate' in "
                                        "{root}/typo.toml; valid keys:"),
    "checkpoint of another model": (["--resume={root}/ckpt/checkpoint.pt"],
                                     "holds a model built with --model mlp --hidden 16; this run "
                                     "builds --model mlp --hidden 8: resume with --model mlp "
                                     "--hidden 16, or start afresh without --resume"),
    "mid-epoch checkpoint on another rank count": (
        ["--resume={root}/ckpt/checkpoint.pt", "--hidden=16"],
        "was written by 1 ranks mid-epoch or with a sharded optimizer: resume it on 1 ranks "
        "(this run has 2)"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_reported_and_ends_the_job(mpirun, hpctrain_cmd, files, tmp_path, case):
    options, *messages = CASES[case]
    run_dir = tmp_path / "run"
    command = [*hpctrain_cmd, "train", f"--data={files}/good.h5", "--hidden=8", "--epochs=1",
               "--batch-size=4", "--allreduce=ring", "--progress=never", f"--run-dir={run_dir}",
               *[o.format(root=files) for o in options]]
    run = mpirun(NP, command, timeout=HANG)
    assert run.returncode == 2, run.output
    for message in messages:
        assert "error: " in run.output and message.format(root=files) in run.output, run.output
    assert "Traceback" not in run.output
    assert run.elapsed < WITHIN, run.output
    assert not run_dir.exists(), "a failed start wrote into the run directory"


def test_async_ps_on_one_rank_names_the_rank_count(mpirun, hpctrain_cmd, files, tmp_path):
    # The one layout in training that a rank count cannot use: a server and no worker.
    run = mpirun(1, [*hpctrain_cmd, "train", f"--data={files}/good.h5", "--regime=async-ps",
                     f"--run-dir={tmp_path / 'run'}"], timeout=HANG)
    assert run.returncode == 2
    assert "--regime async-ps needs at least 2 ranks: rank 0 serves, the others train" \
        in run.output
    assert run.elapsed < WITHIN
    assert not (tmp_path / "run").exists()


def test_configs_of_the_cases_are_otherwise_valid(files, tmp_path):
    # Each case changes one thing: the same command without it trains (so the error above
    # comes from that one change, not from the shared options).
    config = TrainConfig(data=str(files / "good.h5"), hidden=8, epochs=1, batch_size=4,
                         allreduce="ring", progress="never", run_dir=str(tmp_path / "run"))
    assert train(dataclasses.replace(config, max_steps=2), MPI.COMM_SELF).step == 2
