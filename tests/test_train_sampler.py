"""The distributed sampler: equal batch counts, disjoint shares, one global order, resume."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpctrain.sampler import GlobalBatchSampler, shard_indices


def rank_batches(n, batch, size, epoch, **options):
    samplers = [GlobalBatchSampler(n, batch, r, size, **options) for r in range(size)]
    for s in samplers:
        s.set_epoch(epoch)
    return [list(s) for s in samplers]


worlds = st.tuples(st.integers(1, 300), st.integers(1, 17), st.integers(1, 6),
                   st.integers(0, 5), st.integers(0, 3))


@settings(max_examples=200, deadline=None)
@given(worlds)
def test_each_epoch_ranks_are_disjoint_and_cover_the_data(world):
    n, batch, size, epoch, seed = world
    per_rank = rank_batches(n, batch, size, epoch, seed=seed)
    counts = {len(b) for b in per_rank}
    assert len(counts) == 1  # every rank gets the same number of batches
    assert all(len(x) == batch for b in per_rank for x in b)
    seen = np.concatenate([x for b in per_rank for x in b])
    # Everything is covered; only the padding (the first positions again) repeats.
    assert set(seen.tolist()) == set(range(n))
    padding = len(seen) - n
    assert 0 <= padding < batch * size
    if n % (batch * size) == 0:
        assert padding == 0 and len(set(seen.tolist())) == n  # a partition


@settings(max_examples=200, deadline=None)
@given(worlds)
def test_drop_last_shares_are_disjoint(world):
    n, batch, size, epoch, seed = world
    if n < batch * size:
        with pytest.raises(ValueError, match="global batch"):
            GlobalBatchSampler(n, batch, 0, size, drop_last=True)
        return
    per_rank = rank_batches(n, batch, size, epoch, seed=seed, drop_last=True)
    seen = np.concatenate([x for b in per_rank for x in b]).tolist()
    assert len(seen) == len(set(seen)) and n - len(seen) < batch * size


@settings(max_examples=100, deadline=None)
@given(worlds)
def test_n_ranks_see_what_one_rank_with_the_global_batch_sees(world):
    n, batch, size, epoch, seed = world
    per_rank = rank_batches(n, batch, size, epoch, seed=seed)
    single = rank_batches(n, batch * size, 1, epoch, seed=seed)[0]
    assert len(single) == len(per_rank[0])
    for step, big in enumerate(single):
        assert np.array_equal(np.concatenate([b[step] for b in per_rank]), big)


def test_shuffle_depends_on_seed_and_epoch_only():
    a = GlobalBatchSampler(100, 10, 1, 2, seed=3)
    b = GlobalBatchSampler(100, 10, 1, 2, seed=3)
    assert np.array_equal(a.global_order(2), b.global_order(2))
    assert not np.array_equal(a.global_order(2), a.global_order(3))
    assert np.array_equal(GlobalBatchSampler(10, 2, shuffle=False).global_order(4),
                          np.arange(10))


def test_position_resumes_mid_epoch():
    sampler = GlobalBatchSampler(50, 4, 1, 3, seed=1)
    sampler.set_epoch(2)
    batches = list(sampler)
    sampler.set_epoch(2)
    it = iter(sampler)
    next(it), next(it)
    state = sampler.state_dict()
    assert state == {"epoch": 2, "batch": 2, "start": 0}
    resumed = GlobalBatchSampler(50, 4, 1, 3, seed=1)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert all(np.array_equal(x, y) for x, y in zip(rest, batches[2:]))
    assert len(rest) == len(batches) - 2 and resumed.state_dict()["batch"] == len(batches)


@settings(max_examples=150, deadline=None)
@given(worlds, st.integers(1, 6), st.integers(0, 40))
def test_an_epoch_resumed_on_other_ranks_trains_each_sample_once(world, new_size, done):
    # An elastic job loses (or gains) ranks mid-epoch: the rest of the epoch goes to the new
    # ranks without repeating a sample the old ones trained on, nor skipping one.
    n, batch, size, epoch, seed = world
    old = GlobalBatchSampler(n, batch, 0, size, seed=seed)
    old.set_epoch(epoch)
    old.batch = min(done, len(old))
    trained = set(old.global_order(epoch)[:old.batch * batch * size].tolist())
    rest = [GlobalBatchSampler(n, batch, r, new_size, seed=seed) for r in range(new_size)]
    for sampler in rest:
        sampler.load_state_dict(old.state_dict(), size=size)
    shares = [np.concatenate(list(s) or [np.empty(0, int)]).tolist() for s in rest]
    assert len({len(share) for share in shares}) == 1      # equal batch counts
    later = {p for share in shares for p in share}
    if old.batch * batch * size < n:
        assert trained | later == set(range(n))
        fresh = n - len(trained)
        padding = sum(map(len, shares)) - fresh
        assert 0 <= padding < batch * new_size
        # Only the padding may repeat a sample trained already.
        assert sum(p in trained for share in shares for p in share) <= padding
    else:
        assert not later


@pytest.mark.parametrize("args, message", [((10, 0), "batch_size"), ((10, 2, 2, 2), "rank"),
                                           ((0, 2), "num_samples")])
def test_bad_arguments_give_the_valid_range(args, message):
    with pytest.raises(ValueError, match=message):
        GlobalBatchSampler(*args)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 200), st.integers(1, 9))
def test_validation_shards_count_every_sample_once(n, size):
    shards = [shard_indices(n, r, size) for r in range(size)]
    assert np.array_equal(np.concatenate(shards), np.arange(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
