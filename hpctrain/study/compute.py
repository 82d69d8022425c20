"""A training step's compute, measured on this machine: forward, backward, and when backward
hands each layer's gradient over.

``study plan --measure-compute`` puts these in place of one device's samples/s spread over
the layers by their multiply-adds: the plan's schedule then starts each gradient's reduction
when this machine's backward really had it (``register_post_accumulate_grad_hook``, the hook
our ``DistributedOptimizer`` hands buckets over from).
"""

import statistics
import time
from dataclasses import dataclass

from ..errors import UsageError


@dataclass(frozen=True)
class Compute:
    """Medians over the timed steps: forward and backward seconds, and per layer (by the
    name :func:`hpctrain.study.architectures.layers` gives it) the seconds after backward
    started when the last of its parameters' gradients was accumulated."""

    batch: int
    steps: int
    forward_s: float
    backward_s: float
    ready: dict


def measure(model, sample_shape, batch, steps=3, warmup=1):
    """Time ``steps`` forward and backward passes of ``model`` (after ``warmup`` untimed
    ones) on a random batch of ``batch`` samples of ``sample_shape``, on the model's device.

    The loss is the sum of the outputs: a loss function's own cost is negligible beside the
    model's, and any output shape has a sum.
    """
    import torch

    if batch < 1 or steps < 1 or warmup < 0:
        raise UsageError(f"measuring compute needs a batch and steps of at least 1 (got batch "
                         f"{batch}, steps {steps}, warm-up {warmup})")
    names = {m: n for n, m in model.named_modules()}
    owners = {p: names[m] for m in model.modules() for p in m.parameters(recurse=False)
              if p.requires_grad}
    if not owners:
        raise UsageError("the model has no parameters that take a gradient: nothing to time")
    stamps = {}
    hooks = [p.register_post_accumulate_grad_hook(
        lambda p, name=name: stamps.__setitem__((name, id(p)), time.perf_counter()))
        for p, name in owners.items()]
    device = next(iter(owners)).device
    x = torch.randn(batch, *sample_shape, device=device)
    model.train()
    forward, backward, ready = [], [], {}
    try:
        for step in range(warmup + steps):
            model.zero_grad(set_to_none=True)
            stamps.clear()
            start = time.perf_counter()
            loss = model(x).float().sum()
            middle = time.perf_counter()
            loss.backward()
            end = time.perf_counter()
            if step < warmup:
                continue
            forward.append(middle - start)
            backward.append(end - middle)
            per_layer = {}
            for (name, _), stamp in stamps.items():
                per_layer[name] = max(per_layer.get(name, 0.0), stamp - middle)
            for name, offset in per_layer.items():
                ready.setdefault(name, []).append(offset)
    finally:
        for hook in hooks:
            hook.remove()
        model.zero_grad(set_to_none=True)
    return Compute(batch, steps, statistics.median(forward), statistics.median(backward),
                   {name: statistics.median(times) for name, times in ready.items()})
