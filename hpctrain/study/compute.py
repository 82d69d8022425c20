"""A training step's compute, measured on this machine: forward, backward, and when backward
hands each layer's gradient over.

``study plan --measure-compute`` puts these in place of one device's samples/s spread over
the layers by their multiply-adds: the plan's schedule then starts each gradient's reduction
when this machine's backward really had it (``register_post_accumulate_grad_hook``, the hook
our ``DistributedOptimizer`` hands buckets over from).

Two inputs of what hidden communication still costs (:mod:`.overheads`) come from the same
steps: the **spread** of the step's time (standard deviation over mean, with the standard
error of a standard deviation from n steps, 1/√(2(n-1)), as its range), and, with
``beside=True``, the **slowdown** of backward while a reduction runs beside it: as many steps
again with a thread summing two 16 MB tensors on the model's device all along (on a GPU, on
a stream of its own, as a communication library's kernels run), backward's median against
the median alone, the fastest and slowest of those steps as its range.
"""

import math
import statistics
import threading
import time
from dataclasses import dataclass

from ..errors import UsageError
from .overheads import Figure


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
    spread: Figure = None
    slowdown: Figure = None


def measure(model, sample_shape, batch, steps=3, warmup=1, beside=False):
    """Time ``steps`` forward and backward passes of ``model`` (after ``warmup`` untimed
    ones) on a random batch of ``batch`` samples of ``sample_shape``, on the model's device;
    with ``beside``, as many again with a reduction running beside them (the module's text).

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
    try:
        forward, backward, ready = _timed(model, x, stamps, warmup, steps)
        beside_backward = _beside(model, x, stamps, steps, device) if beside else None
    finally:
        for hook in hooks:
            hook.remove()
        model.zero_grad(set_to_none=True)
    alone = statistics.median(backward)
    slowdown = None if beside_backward is None else Figure(
        *(max(1.0, t / alone) for t in (statistics.median(beside_backward),
                                        min(beside_backward), max(beside_backward))),
        f"measured here: {steps} steps with a reduction beside backward")
    return Compute(batch, steps, statistics.median(forward), alone,
                   {name: statistics.median(times) for name, times in ready.items()},
                   _spread([f + b for f, b in zip(forward, backward)]), slowdown)


def _timed(model, x, stamps, warmup, steps):
    # (forward times, backward times, per layer the offsets its gradients were ready at)
    forward, backward, ready = [], [], {}
    for step in range(warmup + steps):
        model.zero_grad(set_to_none=True)
        stamps.clear()
        start = time.perf_counter()
        loss = model(x).float().sum()
        middle = time.perf_counter()
        loss.backward()
        _synchronize(x.device)
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
    return forward, backward, ready


def _beside(model, x, stamps, steps, device):
    # Backward's times while a thread sums 16 MB tensors without pause, as a reduction would.
    import torch

    a, b = (torch.ones(4 << 20, device=device) for _ in range(2))
    done = threading.Event()

    def reduce():
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        while not done.is_set():
            if stream is None:
                torch.add(a, b, out=a)
            else:
                with torch.cuda.stream(stream):
                    torch.add(a, b, out=a)
                stream.synchronize()

    thread = threading.Thread(target=reduce, daemon=True)
    thread.start()
    try:
        return _timed(model, x, stamps, 1, steps)[1]
    finally:
        done.set()
        thread.join()


def _synchronize(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _spread(steps):
    # The step's relative standard deviation as a Figure (None under 3 steps).
    if len(steps) < 3:
        return None
    value = statistics.stdev(steps) / statistics.mean(steps)
    error = 1 / math.sqrt(2 * (len(steps) - 1))
    return Figure(value, value * (1 - error), value * (1 + error),
                  f"measured here: {len(steps)} steps")
