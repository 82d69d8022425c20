"""``--model package.module:factory`` and ``--dataset package.module:factory``."""

import pytest

PLUGIN = '''
import torch
from torch import nn


def small(sample_shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(sample_shape).prod()), classes))


def not_a_model(sample_shape, classes):
    return 42


class Blobs(torch.utils.data.Dataset):
    classes = ["a", "b", "c"]

    def __len__(self):
        return 60

    def __getitem__(self, i):
        label = i % 3
        return torch.full((2, 2), float(label)) + 0.01 * i, label


def blobs():
    return Blobs()
'''


@pytest.fixture
def plugin_env(tmp_path):
    (tmp_path / "myplugin.py").write_text(PLUGIN)
    return {"PYTHONPATH": str(tmp_path)}


def train_args(tmp_path, *extra):
    return ["train", "--epochs", "2", "--progress", "never", "--checkpoint-every", "0",
            "--run-dir", str(tmp_path / "run"), *extra]


@pytest.mark.parametrize("np", [1, 3])
def test_own_model_and_dataset_train_under_mpirun(mpirun, hpctrain_cmd, tmp_path, plugin_env,
                                                   np):
    run = mpirun(np, hpctrain_cmd + train_args(tmp_path, "--model", "myplugin:small",
                                               "--dataset", "myplugin:blobs",
                                               "--batch-size", "4", "--allreduce", "tree"),
                 timeout=240, env=plugin_env)
    assert run.returncode == 0, run.output
    assert "model myplugin:small" in run.output and "data myplugin:blobs" in run.output
    assert "60 samples of 2x2, 3 classes" in run.output, run.output


@pytest.mark.parametrize("args, message", [
    (["--model", "nosuchmodule:small"], "--model 'nosuchmodule:small': cannot import module "
                                        "'nosuchmodule'"),
    (["--model", "myplugin:nothere"], "module 'myplugin' has no attribute 'nothere'"),
    (["--model", "myplugin:not_a_model"], "returned int, not a torch.nn.Module"),
    (["--model", "resnet"], "model: 'resnet' is not one of mlp, cnn, wide, nor a "
                            "package.module:factory"),
    (["--dataset", "myplugin:nope"], "--dataset 'myplugin:nope': module 'myplugin' has no "
                                     "attribute 'nope'"),
    (["--dataset", "myplugin:small"], "the factory failed"),
])
def test_bad_specs_fail_on_every_rank_with_status_2(mpirun, hpctrain_cmd, tmp_path,
                                                    plugin_env, args, message):
    run = mpirun(2, hpctrain_cmd + train_args(tmp_path, *args), timeout=120, env=plugin_env)
    assert run.returncode == 2, run.output
    assert message in run.output, run.output
    assert not (tmp_path / "run" / "metrics.csv").exists()
