"""``mlp``: flatten, two hidden layers of ``hidden`` units with ReLU, then the classes."""

import math

from torch import nn


def build(sample_shape, classes, *, hidden, model_mb=None):
    """The MLP for samples of ``sample_shape`` (any shape; flattened first)."""
    features = math.prod(sample_shape)
    return nn.Sequential(nn.Flatten(), nn.Linear(features, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes))
