"""The one gradient path: buckets handed over while backward runs, tested without MPI.

``submit`` here packs the bucket and runs a local "reduction" at once, on the calling thread;
the communication thread and the collectives are the engine's (tests/mpi).
"""

import pytest
import torch
from torch import nn

from hpctrain.torch.buckets import assign_buckets
from hpctrain.torch.reducer import BucketReducer


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4), nn.ReLU(),
                         nn.Linear(4, 3))


class Done:
    """The handle of an operation that has run: its result, or its error."""

    def __init__(self, result=None, error=None):
        self.result, self.error = result, error

    def wait(self):
        if self.error is not None:
            raise self.error
        return self.result


def local(reduce, log):
    """A ``submit`` that packs the bucket, applies ``reduce`` to its buffer at once and logs
    the bucket's index."""
    def submit(bucket):
        log.append(bucket.index)
        try:
            reduce(bucket.buffer.pack(bucket.gradients()))
        except Exception as exc:  # noqa: BLE001 - handed to synchronize, as the engine does
            return Done(error=exc)
        return Done(bucket.index)
    return submit


def backward(net, rows=7):
    net(torch.randn(rows, 6)).pow(2).mean().backward()


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
def test_buckets_are_handed_over_in_order_with_this_steps_gradients(overlap):
    net, log = model(), []
    reducer = BucketReducer(net.named_parameters(), 60, local(lambda flat: flat.mul_(2), log),
                            overlap=overlap)
    order = list(range(len(reducer.buckets)))
    assert len(order) > 2
    for _ in range(2):          # twice: the reducer starts afresh after synchronize
        log.clear()
        net.zero_grad()
        backward(net)
        during = list(log)
        assert reducer.synchronize() == order
        assert log == order
        # Overlapping: buckets leave during backward; else none leaves before synchronize.
        assert (len(during) > 0) is overlap
        for bucket in reducer.buckets:
            for p, slot in zip(bucket.params, bucket.buffer.slots):
                assert torch.equal(slot, 2 * p.grad)
    reducer.close()


def test_a_bucket_leaves_as_soon_as_backward_has_finished_it():
    net, log = model(), []
    reducer = BucketReducer(net.named_parameters(), 60, local(lambda flat: None, log))
    seen = []
    # Runs when backward reaches the first layer: the last layers' buckets have left.
    net[0].weight.register_hook(lambda grad: seen.append(list(log)))
    backward(net)
    reducer.synchronize()
    reducer.close()
    assert seen[0] and seen[0] == list(range(len(seen[0])))


def test_parameters_without_a_gradient_take_part_as_zeros():
    net, extra, log = model(), nn.Linear(2, 2), []
    named = list(net.named_parameters()) + [("extra." + n, p)
                                           for n, p in extra.named_parameters()]
    reducer = BucketReducer(named, 10**6, local(lambda flat: None, log))
    backward(net)
    reducer.synchronize()
    reducer.close()
    assert log == [0]           # one bucket, handed over by synchronize
    place = reducer.buckets[0].names.index("extra.weight")
    assert torch.equal(reducer.buckets[0].buffer.slot(place), torch.zeros(2, 2))


def test_a_failed_operation_is_raised_by_synchronize_and_the_next_step_starts_afresh():
    net, log = model(), []
    failing = [True]

    def reduce(flat):
        if failing[0]:
            raise OSError("link down")

    reducer = BucketReducer(net.named_parameters(), 60, local(reduce, log))
    backward(net)
    with pytest.raises(OSError, match="link down"):
        reducer.synchronize()
    assert not reducer.in_step
    failing[0] = False
    net.zero_grad()
    backward(net)
    assert reducer.synchronize() == list(range(len(reducer.buckets)))
    reducer.close()


def test_gradients_accumulate_over_the_passes_of_a_step_before_they_leave():
    net, log = model(), []
    reducer = BucketReducer(net.named_parameters(), 60, local(lambda flat: None, log), passes=2)
    backward(net)
    assert log == [] and reducer.in_step
    backward(net)
    assert log                  # the second pass completes the buckets
    with pytest.raises(AssertionError, match="more than backward_passes_per_step"):
        backward(net)
    reducer.reset()
    reducer.close()


def test_a_skipping_reducer_counts_but_hands_nothing_over():
    net, log = model(), []
    reducer = BucketReducer(net.named_parameters(), 60, local(lambda flat: None, log),
                            skip=True)
    backward(net)
    assert reducer.in_step
    assert reducer.synchronize() == [None] * len(reducer.buckets)
    assert log == [] and not reducer.in_step
    reducer.close()
    backward(net)               # no hooks: nothing counted
    assert not reducer.in_step


def test_the_in_order_thread_runs_operations_as_submitted_and_hands_errors_back():
    from hpctrain.torch.reducer import InOrder

    ran, channel = [], InOrder()
    try:
        handles = [channel.submit(lambda i=i: ran.append(i) or i) for i in range(5)]
        failed = channel.submit(lambda: 1 / 0)
        assert [h.wait() for h in handles] == list(range(5)) == ran
        with pytest.raises(ZeroDivisionError):
            failed.wait()
        assert channel.submit(lambda: "after").wait() == "after"
    finally:
        channel.close()
