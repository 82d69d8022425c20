"""Which rows each rank reads: the global batch sampler and the validation shard.

One *global* sample order per epoch, the same on every rank: a permutation seeded by
``seed + epoch`` (like PyTorch's ``DistributedSampler``), cut into global batches of
``batch_size × size`` positions. Rank ``r`` takes the contiguous slice
``[r·batch_size, (r+1)·batch_size)`` of each global batch. Hence:

- the ranks' batches of one step are disjoint and together form global batch ``k``;
- N ranks with per-rank batch b see exactly the samples, in the same order, that one rank
  with batch N·b sees: data-parallel training computes the same mean gradient;
- every rank gets the same number of batches, which collectives need (a rank with one batch
  fewer would leave the others waiting in an allreduce forever).

The last global batch is completed by repeating the first positions of the epoch's order
(``drop_last=False``, the default) or dropped (``drop_last=True``). The sampler keeps its
position (epoch, next batch) so that a checkpoint can resume mid-epoch, also on another
number of ranks (an elastic job that lost some): the samples of the epoch done so far
(``start``) are skipped, and the rest of the epoch's order is cut into global batches of
the new size.
"""

import math

import numpy as np


class GlobalBatchSampler:
    """This rank's batches of positions ``0 … num_samples-1``, epoch after epoch: its slice
    of each global batch. (PyTorch's ``DistributedSampler`` yields one index at a time, and
    no batches: another contract, hence another name.)

    Iterating yields the batches of the current epoch from the current position on and
    advances the position; call ``set_epoch`` before each epoch. ``rank`` and ``size`` may
    also describe a subset of the ranks (the workers of an asynchronous parameter server).
    """

    def __init__(self, num_samples, batch_size, rank=0, size=1, *, shuffle=True, seed=0,
                 drop_last=False):
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"rank must be in [0, {size}) and size >= 1, got rank {rank} "
                             f"and size {size}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if drop_last and num_samples < batch_size * size:
            raise ValueError(f"drop_last with {num_samples} samples leaves no batch: the "
                             f"global batch ({batch_size} × {size} ranks) must be <= "
                             f"{num_samples}")
        self.num_samples, self.batch_size = num_samples, batch_size
        self.rank, self.size = rank, size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch, self.batch = 0, 0
        self.start = 0      # positions of this epoch's order done before batch 0

    @property
    def global_batch_size(self):
        """Samples per step over all ranks: ``batch_size × size``."""
        return self.batch_size * self.size

    def __len__(self):
        """Batches per epoch (after ``start``), the same on every rank."""
        left = self.num_samples - self.start
        if self.drop_last:
            return left // self.global_batch_size
        return math.ceil(left / self.global_batch_size)

    @property
    def padding(self):
        """Positions repeated per epoch to complete the last global batch (0 with drop_last)."""
        return max(0, len(self) * self.global_batch_size - (self.num_samples - self.start))

    def set_epoch(self, epoch):
        """Start ``epoch`` at its first batch.

        Call it before every epoch, on every rank, with the same epoch: the shuffle depends
        on it, and without it every epoch repeats the same order.
        """
        self.epoch, self.batch, self.start = epoch, 0, 0

    def global_order(self, epoch):
        """Every rank's positions of ``epoch``, step after step: ``len(self) × global batch``."""
        order = epoch_order(self.num_samples, self.seed, epoch, self.shuffle)[self.start:]
        # np.resize repeats the order from its start: the padding re-uses the first positions.
        return np.resize(order, len(self) * self.global_batch_size)

    def batch_indices(self, epoch, batch):
        """This rank's positions in step ``batch`` of ``epoch``."""
        start = batch * self.global_batch_size + self.rank * self.batch_size
        return self.global_order(epoch)[start:start + self.batch_size]

    def __iter__(self):
        order = self.global_order(self.epoch)
        while self.batch < len(self):
            start = self.batch * self.global_batch_size + self.rank * self.batch_size
            # Advance first: a checkpoint taken after this step resumes at the next batch.
            self.batch += 1
            yield order[start:start + self.batch_size]

    def state_dict(self):
        """The position: the epoch, the positions done before batch 0, the next batch."""
        return {"epoch": self.epoch, "batch": self.batch, "start": self.start}

    def load_state_dict(self, state, size=None):
        """Continue from a position saved by ``state_dict`` of a sampler over ``size``
        ranks (default: this one's). Over another number of ranks, the positions done so
        far become ``start`` and the rest of the epoch is batched anew."""
        start, batch = state.get("start", 0), state["batch"]
        if size is not None and size != self.size:
            start, batch = min(start + batch * self.batch_size * size, self.num_samples), 0
        self.start = start
        if not 0 <= batch <= len(self):
            raise ValueError(f"sampler position batch {batch} is outside an epoch of "
                             f"{len(self)} batches")
        self.epoch, self.batch = state["epoch"], batch


def epoch_order(num_samples, seed, epoch, shuffle=True):
    """The positions ``0 … num_samples-1`` in epoch ``epoch``'s order: a permutation seeded
    by ``seed + epoch`` (the same on every rank), or in order without ``shuffle``."""
    if not shuffle:
        return np.arange(num_samples)
    return np.random.default_rng(seed + epoch).permutation(num_samples)


def shard_indices(num_samples, rank, size):
    """Rank ``rank``'s contiguous share of ``0 … num_samples-1``, without padding.

    Shares differ in length by at most one and together cover every position exactly once,
    so metrics summed over ranks count each sample once (use it for validation, never for
    training: unequal counts would unbalance collectives).
    """
    base, extra = divmod(num_samples, size)
    start = rank * base + min(rank, extra)
    return np.arange(start, start + base + (1 if rank < extra else 0))
