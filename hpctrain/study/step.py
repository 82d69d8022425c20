"""The step model both ``study plan`` and ``study plan --against`` predict with: one
data-parallel training step at p ranks, from the gradients' sizes and when backward has them
ready, a gradient policy, the cost model's time per reduction and what hidden communication
still costs (:mod:`.overheads`).

- **gradients** are ready when backward has passed their layer; a **policy** groups them:
  ``hpctrain`` (our ``DistributedOptimizer``: buckets cut in backward order, one
  negotiation per bucket), ``ddp`` (PyTorch's: 25 MB buckets, the first one 1 MB, no
  negotiation) or ``horovod`` (a tensor per layer, each negotiated; every cycle, everything
  ready is fused up to the fusion buffer's size);
- **one communication channel** reduces the groups in order, each as soon as it is ready and
  the channel is free, in the negotiation's time plus the time the cost model gives;
- what the channel has not finished when backward ends is **exposed**; besides it the step
  pays the **framework**'s own work per gradient, the **stragglers**, the **tail** (the late
  gradients' update), the **slowdown** of backward while a reduction runs beside it, and the
  **residual** a measured run left: step = forward + backward + exposed + negotiation +
  framework + slowdown + tail + stragglers + residual.
"""

import math
from dataclasses import asdict, dataclass

from ..collectives import cost
from .overheads import Overheads, expected_max

POLICIES = ("hpctrain", "ddp", "horovod")
DDP_BUCKET, DDP_FIRST = 25 * 2**20, 1 * 2**20


@dataclass(frozen=True)
class Gradient:
    """A layer's gradient: its bytes and when backward has it ready (s after backward starts)."""

    name: str
    nbytes: int
    ready: float


@dataclass(frozen=True)
class Transfer:
    """One reduction on the channel: its bytes and tensors, when its data was ready, start
    and end."""

    nbytes: int
    ready: float
    start: float
    end: float
    tensors: int = 1


@dataclass(frozen=True)
class Cluster:
    """``ranks_per_node`` ranks per node; links inside and between nodes as cost parameters."""

    ranks_per_node: int
    params: cost.Params
    description: str


def gradients(layers, backward_s):
    """The layers' gradients in backward order, each ready when backward has passed its
    layer, backward's time shared in proportion to the layers' multiply-adds."""
    total = sum(layer.macs for layer in layers) or 1.0
    clock, out = 0.0, []
    for layer in reversed(layers):
        clock += backward_s * layer.macs / total
        out.append(Gradient(layer.name, layer.nbytes, clock))
    return out


def measured_gradients(layers, compute, scale=1.0):
    """The layers' gradients in the order a measured backward (:mod:`.compute`) had them
    ready, each at its measured time times ``scale``; a layer that got no gradient, at
    backward's end."""
    grads = [Gradient(layer.name, layer.nbytes,
                      scale * compute.ready.get(layer.name, compute.backward_s))
             for layer in layers]
    return sorted(grads, key=lambda grad: grad.ready)


def buckets(grads, bucket_bytes, first_bytes=None):
    """``(nbytes, ready, tensors)`` per bucket, cut in backward order as our
    ``assign_buckets`` cuts them: a bucket closes when the next gradient would take it past
    ``bucket_bytes`` (the first one past ``first_bytes``, DDP's small first bucket); a
    larger gradient is alone."""
    out, size, ready, count = [], 0, 0.0, 0
    for grad in grads:
        cap = first_bytes if first_bytes is not None and not out else bucket_bytes
        if size and size + grad.nbytes > cap:
            out.append((size, ready, count))
            size, count = 0, 0
        size, ready, count = size + grad.nbytes, grad.ready, count + 1
    if size:
        out.append((size, ready, count))
    return out


def in_order(groups, seconds):
    """The channel's transfers of ``groups`` (``(nbytes, ready, tensors)``), in order, each
    starting when ready and the previous one has ended; ``seconds(nbytes, tensors)`` is one
    reduction's time."""
    out, free = [], 0.0
    for nbytes, ready, tensors in groups:
        start = max(ready, free)
        free = start + seconds(nbytes, tensors)
        out.append(Transfer(nbytes, ready, start, free, tensors))
    return out


def fused(grads, fusion_bytes, cycle_s, seconds):
    """Horovod's schedule: at each cycle tick when the channel is free, everything ready by
    then (in backward order) is fused into one reduction, up to ``fusion_bytes``."""
    out, free, index = [], 0.0, 0
    while index < len(grads):
        tick = max(free, grads[index].ready)
        tick = math.ceil(tick / cycle_s - 1e-9) * cycle_s if cycle_s > 0 else tick
        size, ready, count = 0, 0.0, 0
        while index < len(grads) and grads[index].ready <= tick + 1e-12 and \
                (size == 0 or size + grads[index].nbytes <= fusion_bytes):
            size, ready, count = size + grads[index].nbytes, grads[index].ready, count + 1
            index += 1
        free = tick + seconds(size, count)
        out.append(Transfer(size, ready, tick, free, count))
    return out


def step_times(forward_s, backward_s, transfers):
    """``(step s, exposed s)``: forward, backward, and what the channel has left after it."""
    last = max((t.end for t in transfers), default=0.0)
    exposed = max(0.0, last - backward_s)
    return forward_s + backward_s + exposed, exposed


def schedule(grads, policy, seconds, bucket_mb=25.0, fusion_mb=64.0, cycle_ms=1.0):
    """The channel's transfers under ``policy``; ``seconds(nbytes, tensors)``, where
    ``tensors`` is what the policy negotiates (a bucket is one request of ours, DDP
    negotiates nothing, Horovod every tensor)."""
    if policy == "horovod":
        return fused(grads, fusion_mb * 2**20, cycle_ms / 1000, seconds)
    if policy == "ddp":
        groups = [(n, ready, 0) for n, ready, _ in buckets(grads, DDP_BUCKET, DDP_FIRST)]
    else:
        groups = [(n, ready, 1) for n, ready, _ in buckets(grads, bucket_mb * 2**20)]
    return in_order(groups, seconds)


def overlapped(transfers, backward_s, reduction=None):
    """Seconds the channel is busy while backward runs; with ``reduction(nbytes, tensors)``
    (a transfer's reduction alone), only the seconds its reductions run: a negotiation comes
    first and moves no gradient through the device, so it does not slow backward."""
    def start(t):
        return t.start if reduction is None else max(t.start, t.end - reduction(t.nbytes,
                                                                                t.tensors))
    return sum(max(0.0, min(t.end, backward_s) - start(t)) for t in transfers)


def predict(grads, forward_s, backward_s, p, cluster, algo, policy, bucket_mb=25.0,
            fusion_mb=64.0, cycle_ms=1.0, overheads=None):
    """One prediction: the step at ``p`` ranks with ``algo`` and ``policy``, term by term
    (seconds): ``compute_s``, ``exposed_s`` (communication alone), ``negotiation_s``,
    ``framework_s``, ``slowdown_s``, ``tail_s``, ``straggler_s``, ``residual_s`` and their
    sum ``step_s``."""
    overheads = overheads or Overheads()
    nodes = max(1, p // cluster.ranks_per_node)
    options = {"ranks_per_node": min(p, cluster.ranks_per_node)}

    def reduction(nbytes, tensors):
        return cost.predict(algo, nbytes, p, cluster.params, nodes, **options)

    def negotiated(nbytes, tensors):
        return reduction(nbytes, tensors) + overheads.negotiation_s(tensors, p)

    compute = forward_s + backward_s
    bare = transfers = []
    if p > 1:
        bare = schedule(grads, policy, reduction, bucket_mb, fusion_mb, cycle_ms)
        transfers = schedule(grads, policy, negotiated, bucket_mb, fusion_mb, cycle_ms)
    exposed = step_times(forward_s, backward_s, bare)[1]
    negotiation = step_times(forward_s, backward_s, transfers)[1] - exposed
    late = sum(t.nbytes for t in transfers if t.end > backward_s + 1e-12)
    total = sum(t.nbytes for t in transfers) or 1
    terms = {"compute_s": compute, "exposed_s": exposed, "negotiation_s": negotiation,
             "framework_s": overheads.framework_s(len(grads), p, policy),
             "slowdown_s": (overheads.slowdown_at(nodes) - 1) * overlapped(transfers, backward_s,
                                                                          reduction),
             "tail_s": overheads.update_s.value * late / total,
             "straggler_s": overheads.spread.value * compute * expected_max(p),
             "residual_s": overheads.residual_s(compute, p, inside_node=nodes == 1)}
    return {"np": p, "nodes": nodes, "algo": algo, "policy": policy,
            "bucket_mb": bucket_mb if policy == "hpctrain" else None, **terms,
            "step_s": sum(terms.values()),
            "comm_s": sum(t.end - t.start for t in transfers), "transfers": len(transfers),
            "timeline": [asdict(t) for t in transfers]}
