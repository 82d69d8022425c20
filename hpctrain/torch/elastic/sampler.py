"""``ElasticSampler``: a distributed sampler that knows how much of the epoch is done, so
that after a reset the rest of the epoch is split over the ranks that are left.

Like ``torch.utils.data.DistributedSampler`` it shuffles with a seed and the epoch (the
same permutation on every rank, :func:`hpctrain.sampler.epoch_order`), pads the remaining
indices to a multiple of the number of ranks and gives each rank a strided slice. The
permutation's first ``processed_num`` indices have been trained on (every rank records each
batch it ran, counting the batches of all ranks); the rest of the epoch is the permutation
after them.
"""

import math

import torch
import torch.utils.data

from ..basics import rank, size
from ...sampler import epoch_order


class ElasticSampler(torch.utils.data.Sampler):
    """Every rank's share of what is left of the epoch, repartitioned at each reset.

    ``record_batch(batch_idx, batch_size)`` after each batch; ``set_epoch(e)`` at the *end*
    of each epoch (it forgets what was processed; calling it at the start of the next epoch
    instead would, after a failure early in that epoch, train the same samples twice). Keep
    it in a :class:`~hpctrain.torch.elastic.TorchState` so it is committed, restored and
    synced with the model. ``seed`` must be the same on every rank.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0          # samples of this epoch done, over all ranks
        self.reset()

    def set_epoch(self, epoch):
        """Start epoch ``epoch`` afresh: nothing of it processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Count one batch of ``batch_size`` samples on every rank as done."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        """What a commit keeps: the epoch and how far into it the ranks are."""
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        """Go back to ``state_dict`` and repartition what is left over the current ranks."""
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        """Split what is left of the epoch over the ranks there are now."""
        self.num_replicas, self.rank = size(), rank()
        order = epoch_order(len(self.dataset), self.seed, self.epoch, self.shuffle)
        self.remaining_indices = order[self.processed_num:].tolist()
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = list(self.remaining_indices)
        # Padded with the first ones again so every rank gets as many: uneven counts would
        # leave a rank waiting in a collective the others never make.
        while len(indices) < self.total_size:
            indices += indices[:self.total_size - len(indices)]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples
