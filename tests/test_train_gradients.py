"""Gradient buckets reduced during backward, tested without MPI (a local 'reduction')."""

import threading

import pytest
import torch
from torch import nn

from hpctrain.train.gradients import BucketReducer, assign_buckets
from hpctrain.train.schedule import WarmupSchedule, target_lr


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4), nn.ReLU(),
                         nn.Linear(4, 3))


def test_buckets_take_parameters_in_reverse_order_up_to_the_cap():
    named = list(model().named_parameters())
    buckets = assign_buckets(named, bucket_bytes=4 * 20)
    flat = [name for bucket in buckets for name, _ in bucket]
    assert flat == [name for name, _ in reversed(named)]
    for bucket in buckets:
        size = sum(p.numel() * 4 for _, p in bucket)
        assert size <= 80 or len(bucket) == 1   # only a lone large parameter may exceed
    assert [n for n, _ in buckets[0]] == ["4.bias", "4.weight", "2.bias"]  # 76 of 80 bytes


def test_a_dtype_change_starts_a_new_bucket():
    a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2, dtype=torch.float64))
    assert len(assign_buckets([("a", a), ("b", b)], 10**6)) == 2


@pytest.mark.parametrize("overlap", [True, False])
def test_reduced_gradients_replace_the_local_ones(overlap):
    calls = []

    def double(flat, bucket):
        calls.append((bucket.index, threading.current_thread().name))
        flat *= 2

    net = model()
    reference = model()
    reducer = BucketReducer(net.named_parameters(), double, bucket_mb=60 / 2**20,
                            overlap=overlap)
    try:
        for _ in range(2):  # twice: the reducer resets between steps
            calls.clear()
            x = torch.randn(7, 6)
            net.zero_grad()
            reference.zero_grad()
            net(x).pow(2).mean().backward()
            reference(x).pow(2).mean().backward()
            assert reducer.wait() >= 0
            for p, q in zip(net.parameters(), reference.parameters()):
                assert torch.allclose(p.grad, 2 * q.grad)
            assert [index for index, _ in calls] == list(range(len(reducer.buckets)))
            on_thread = {name == "hpctrain-grad-comm" for _, name in calls}
            assert on_thread == {overlap}
    finally:
        reducer.close()


def test_buckets_start_during_backward_when_overlapping():
    started = []
    net = model()

    def record(flat, bucket):
        started.append(bucket.index)

    reducer = BucketReducer(net.named_parameters(), record, bucket_mb=60 / 2**20)
    seen_during_backward = []

    def spy(grad):  # runs when backward reaches the first layer: later buckets are queued
        seen_during_backward.append(reducer._next)
        return grad

    net[0].weight.register_hook(spy)
    net(torch.randn(3, 6)).sum().backward()
    reducer.wait()
    reducer.close()
    assert seen_during_backward[0] >= 1  # at least one bucket was launched before backward ended


def test_unused_parameters_are_reduced_as_zeros():
    net = model()
    extra = nn.Linear(2, 2)
    named = list(net.named_parameters()) + [("extra." + n, p) for n, p in extra.named_parameters()]
    seen = []
    reducer = BucketReducer(named, lambda flat, bucket: seen.append(flat.clone()), bucket_mb=1)
    net(torch.randn(2, 6)).sum().backward()
    reducer.wait()
    reducer.close()
    assert torch.equal(extra.weight.grad, torch.zeros(2, 2))


def test_a_failing_reduction_is_raised_by_wait():
    def fail(flat, bucket):
        raise OSError("link down")

    net = model()
    reducer = BucketReducer(net.named_parameters(), fail, bucket_mb=1)
    net(torch.randn(2, 6)).sum().backward()
    with pytest.raises(OSError, match="link down"):
        reducer.wait()
    reducer.close()


def test_linear_scaling_and_warmup():
    assert target_lr(0.1, 256, 32, "linear") == pytest.approx(0.8)
    assert target_lr(0.1, 256, 32, "none") == 0.1
    schedule = WarmupSchedule(0.1, 0.8, warmup_steps=10)
    assert schedule(0) == 0.1 and schedule(5) == pytest.approx(0.45)
    assert schedule(10) == schedule(1000) == 0.8
    cosine = WarmupSchedule(0.1, 0.8, warmup_steps=10, total_steps=30, decay="cosine")
    assert cosine(10) == pytest.approx(0.8) and cosine(20) == pytest.approx(0.4)
    assert cosine(30) == pytest.approx(0.0, abs=1e-12)
