"""``cnn``: two 3×3 convolution blocks, global average pooling, then the classes.

Samples must be images (C, H, W); (H, W) samples get one channel. Global pooling makes the
network work at any image size (8×8 digits, 28×28 synthetic).
"""

from torch import nn


def build(sample_shape, classes, *, hidden, model_mb=None):
    """The CNN for image samples; ``hidden`` sets the width of the second block."""
    if len(sample_shape) not in (2, 3):
        raise ValueError(f"the cnn model needs image samples (C, H, W) or (H, W), "
                         f"got shape {sample_shape}")
    channels = sample_shape[0] if len(sample_shape) == 3 else 1
    width = max(8, hidden // 4)
    layers = [] if len(sample_shape) == 3 else [nn.Unflatten(1, (1, *sample_shape))]
    return nn.Sequential(
        *layers,
        nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True),
        nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, classes))
