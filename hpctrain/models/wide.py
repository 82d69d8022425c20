"""``wide``: an MLP sized by its gradient, ``model_mb`` MB (float32), for communication runs.

Four hidden layers of equal width w; w solves ``bytes(w) = model_mb · 2**20`` for
``features·w + 3·w² + w·classes`` weights plus biases. Several equal layers give several
gradient buckets, so that their allreduces can overlap the rest of backward.
"""

import math

from torch import nn

DEPTH = 4
BYTES_PER_PARAM = 4


def width_for(model_mb, features, classes, depth=DEPTH):
    """The hidden width whose model holds about ``model_mb`` MB of float32 parameters."""
    target = model_mb * 2**20 / BYTES_PER_PARAM
    # (depth-1)·w² + (features + classes + depth)·w + classes = target
    a, b, c = depth - 1, features + classes + depth, classes - target
    return max(1, round((-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)))


def build(sample_shape, classes, *, hidden=None, model_mb):
    """The wide MLP for samples of ``sample_shape``; ``hidden`` is ignored."""
    features = math.prod(sample_shape)
    width = width_for(model_mb, features, classes)
    layers = [nn.Flatten(), nn.Linear(features, width), nn.ReLU()]
    for _ in range(DEPTH - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, classes))
