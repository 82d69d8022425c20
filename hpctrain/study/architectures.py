"""Standard ImageNet architectures, built from ``torch.nn`` for planning: shapes, not weights.

``study plan`` needs a model's gradients (sizes, in the order backward produces them) and
its work per layer, not its weights: :func:`build` makes the model on PyTorch's ``meta``
device (no memory, no download) and :func:`layers` runs one forward pass there to find, per
layer with parameters, its parameter bytes and its multiply-adds at a given batch. The
architectures follow their papers; the parameter counts are the published ones
(``tests/test_plan.py`` checks them): ResNet-50 25.6 M and ResNet-101 44.5 M (He et al.
2016), VGG-16 138.4 M (Simonyan and Zisserman 2015), Inception V3 23.8 M without its
auxiliary classifier (Szegedy et al. 2016).
"""

from dataclasses import dataclass

import torch
from torch import nn

#: The input side length each architecture is defined for.
INPUT = {"resnet50": 224, "resnet101": 224, "vgg16": 224, "inception_v3": 299}


@dataclass(frozen=True)
class Layer:
    """One module with parameters: its name, its gradient's bytes (float32) and its
    multiply-adds per sample in the forward pass."""

    name: str
    nbytes: int
    macs: float


def _conv(cin, cout, kernel, stride=1, padding=0):
    # Convolution without bias, then batch norm and ReLU: the unit of ResNet and Inception.
    return [nn.Conv2d(cin, cout, kernel, stride, padding, bias=False), nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True)]


class Bottleneck(nn.Module):
    """ResNet's 1x1 - 3x3 - 1x1 block with four times the width out, and its shortcut."""

    def __init__(self, cin, width, stride):
        super().__init__()
        self.body = nn.Sequential(*_conv(cin, width, 1), *_conv(width, width, 3, stride, 1),
                                  nn.Conv2d(width, 4 * width, 1, bias=False),
                                  nn.BatchNorm2d(4 * width))
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, 4 * width, 1, stride, bias=False),
                                       nn.BatchNorm2d(4 * width))
                         if stride != 1 or cin != 4 * width else nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet(blocks):
    """ResNet with ``blocks`` bottlenecks per stage ([3, 4, 6, 3]: ResNet-50)."""
    layers, cin = [*_conv(3, 64, 7, 2, 3), nn.MaxPool2d(3, 2, 1)], 64
    for stage, count in enumerate(blocks):
        width = 64 * 2 ** stage
        for i in range(count):
            layers.append(Bottleneck(cin, width, 2 if i == 0 and stage > 0 else 1))
            cin = 4 * width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000))


def vgg16():
    """VGG-16 (configuration D): 13 convolutions with biases, three fully connected layers."""
    layers, cin = [], 3
    for item in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                 512, 512, 512, "M"):
        if item == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, item, 3, padding=1), nn.ReLU(inplace=True)]
            cin = item
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(512 * 7 * 7, 4096), nn.ReLU(),
                         nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1000))


class Branches(nn.Module):
    """Inception's parallel branches, concatenated along the channels."""

    def __init__(self, *branches):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        outs = []
        for branch in self.branches:
            out = branch(x)
            outs += out if isinstance(out, list) else [out]
        return torch.cat(outs, 1)


class Split(nn.Module):
    """A branch that ends in two parallel convolutions (Inception's E block)."""

    def __init__(self, stem, left, right):
        super().__init__()
        self.stem, self.left, self.right = stem, left, right

    def forward(self, x):
        x = self.stem(x)
        return [self.left(x), self.right(x)]


def _seq(*convs):
    return nn.Sequential(*[m for spec in convs for m in _conv(*spec)])


def _pooled(cin, cout):
    return nn.Sequential(nn.AvgPool2d(3, 1, 1), *_conv(cin, cout, 1))


def inception_a(cin, pool):
    return Branches(_seq((cin, 64, 1)), _seq((cin, 48, 1), (48, 64, 5, 1, 2)),
                    _seq((cin, 64, 1), (64, 96, 3, 1, 1), (96, 96, 3, 1, 1)), _pooled(cin, pool))


def inception_b(cin):
    return Branches(_seq((cin, 384, 3, 2)), _seq((cin, 64, 1), (64, 96, 3, 1, 1), (96, 96, 3, 2)),
                    nn.MaxPool2d(3, 2))


def inception_c(cin, c7):
    row, col = ((1, 7), 1, (0, 3)), ((7, 1), 1, (3, 0))
    return Branches(_seq((cin, 192, 1)),
                    _seq((cin, c7, 1), (c7, c7, *row), (c7, 192, *col)),
                    _seq((cin, c7, 1), (c7, c7, *col), (c7, c7, *row), (c7, c7, *col),
                         (c7, 192, *row)),
                    _pooled(cin, 192))


def inception_d(cin):
    return Branches(_seq((cin, 192, 1), (192, 320, 3, 2)),
                    _seq((cin, 192, 1), (192, 192, (1, 7), 1, (0, 3)),
                         (192, 192, (7, 1), 1, (3, 0)), (192, 192, 3, 2)),
                    nn.MaxPool2d(3, 2))


def inception_e(cin):
    def pair(c):
        return _seq((c, 384, (1, 3), 1, (0, 1))), _seq((c, 384, (3, 1), 1, (1, 0)))
    return Branches(_seq((cin, 320, 1)), Split(_seq((cin, 384, 1)), *pair(384)),
                    Split(_seq((cin, 448, 1), (448, 384, 3, 1, 1)), *pair(384)),
                    _pooled(cin, 192))


def inception_v3():
    """Inception V3 for 299x299 inputs, without the auxiliary classifier."""
    return nn.Sequential(
        *_seq((3, 32, 3, 2), (32, 32, 3), (32, 64, 3, 1, 1)), nn.MaxPool2d(3, 2),
        *_seq((64, 80, 1), (80, 192, 3)), nn.MaxPool2d(3, 2),
        inception_a(192, 32), inception_a(256, 64), inception_a(288, 64), inception_b(288),
        inception_c(768, 128), inception_c(768, 160), inception_c(768, 160),
        inception_c(768, 192), inception_d(768), inception_e(1280), inception_e(2048),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))


FACTORIES = {"resnet50": lambda: resnet([3, 4, 6, 3]), "resnet101": lambda: resnet([3, 4, 23, 3]),
             "vgg16": vgg16, "inception_v3": inception_v3}


def build(name):
    """Architecture ``name`` on the meta device (``KeyError`` for an unknown one)."""
    with torch.device("meta"):
        return FACTORIES[name]()


def layers(model, sample_shape):
    """The model's layers with parameters, in the order forward reaches them: per layer its
    gradient bytes (float32) and multiply-adds per sample (convolutions and linear layers;
    the others' are too small to matter and count 0). One forward pass of a batch of one on
    the meta device: no memory, no compute."""
    found = []

    def record(module, inputs, output):
        own = list(module.parameters(recurse=False))
        if not own:
            return
        macs = 0.0
        if isinstance(module, nn.Conv2d):
            kh, kw = module.kernel_size
            macs = output.numel() * module.in_channels // module.groups * kh * kw
        elif isinstance(module, nn.Linear):
            macs = module.in_features * module.out_features
        found.append((module, sum(p.numel() * 4 for p in own), float(macs)))

    hooks = [m.register_forward_hook(record) for m in model.modules()]
    try:
        device = next(model.parameters()).device
        with torch.no_grad():
            model(torch.empty(1, *sample_shape, device=device))
    finally:
        for hook in hooks:
            hook.remove()
    names = {m: n for n, m in model.named_modules()}
    return [Layer(names[m], nbytes, macs) for m, nbytes, macs in found]
