"""The model registry: ``build_model(name, sample_shape, classes, ...)``.

- ``mlp``: two hidden layers, the default for the digits;
- ``cnn``: a small convolutional network for image-shaped samples (C, H, W);
- ``wide``: a multi-layer perceptron whose width is chosen so that its parameters (and so its
  gradient) take ``model_mb`` MB: a communication-heavy model for comparing allreduce
  algorithms.

Adding a model: one new module with ``build(sample_shape, classes, *, hidden, model_mb)``
and its name in ``MODELS``, the one list every command checks ``--model`` against. A user's
own model needs no change here: a name ``package.module:factory`` calls
``factory(sample_shape, classes) -> nn.Module``.

Importing this package imports no torch (a configuration is checked before torch loads);
building a model does.
"""

import importlib

from .. import plugins
from ..errors import UsageError

#: The models by name: each is the module of this package that holds its ``build``.
MODELS = ("mlp", "cnn", "wide")


def build_model(name, sample_shape, classes, *, hidden=128, model_mb=16.0, seed=0):
    """A freshly initialised model; the same ``seed`` gives the same weights on every rank."""
    if plugins.is_spec(name):
        return _build_own(name, tuple(sample_shape), classes, seed)
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}, or "
                         f"package.module:factory")
    import torch

    build = importlib.import_module(f"{__name__}.{name}").build
    # Initialise from a private generator so that building a model leaves the caller's
    # random state alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build(tuple(sample_shape), classes, hidden=hidden, model_mb=model_mb)


def parameter_bytes(model):
    """Bytes taken by the model's parameters (and so by one full gradient)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _build_own(spec, sample_shape, classes, seed):
    import torch
    from torch import nn

    factory = plugins.load(spec, "--model")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = factory(sample_shape, classes)
        except Exception as exc:  # noqa: BLE001 - the user's factory failed
            raise UsageError(f"--model {spec!r}: factory({sample_shape}, {classes}) failed: "
                             f"{type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise UsageError(f"--model {spec!r}: the factory returned {type(model).__name__}, "
                         f"not a torch.nn.Module")
    return model
