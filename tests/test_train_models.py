"""The model registry."""

import pytest
import torch

from hpctrain.models import MODELS, build_model, parameter_bytes


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 9, 7)])
def test_every_model_maps_samples_to_class_scores(name, shape):
    model = build_model(name, shape, 10, hidden=16, model_mb=0.5)
    assert model(torch.zeros(5, *shape)).shape == (5, 10)


def test_same_seed_same_weights_and_no_change_to_the_global_generator():
    state = torch.get_rng_state()
    a = build_model("mlp", (64,), 10, seed=3)
    b = build_model("mlp", (64,), 10, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    c = build_model("mlp", (64,), 10, seed=4)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


@pytest.mark.parametrize("mb", [0.25, 4, 16, 64])
def test_wide_model_gradient_is_the_asked_size(mb):
    model = build_model("wide", (1, 8, 8), 10, model_mb=mb)
    assert parameter_bytes(model) / 2**20 == pytest.approx(mb, rel=0.01)


def test_unknown_model_and_bad_cnn_input():
    with pytest.raises(ValueError, match="choose one of mlp, cnn, wide"):
        build_model("resnet", (1, 8, 8), 10)
    with pytest.raises(ValueError, match="image samples"):
        build_model("cnn", (64,), 10)


def test_train_checks_model_names_against_the_registry_itself():
    # A second list of names in the configuration once rejected a model added here.
    import subprocess
    import sys

    from hpctrain.train import config

    assert config.MODELS is MODELS
    # Checking a configuration loads no torch: the registry names its modules, not builders.
    done = subprocess.run([sys.executable, "-c", "import sys, hpctrain.train.config; "
                           "print('torch' in sys.modules)"], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "False", done.stdout + done.stderr
