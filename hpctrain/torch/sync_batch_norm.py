"""Batch normalisation whose statistics are those of every rank's batch together.

    import hpctrain.torch as hvd
    from hpctrain.torch.sync_batch_norm import SyncBatchNorm

    hvd.init()
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), SyncBatchNorm(16), ...)

:class:`SyncBatchNorm` is Horovod's ``hvd.SyncBatchNorm`` (the same constructor) on the CPU
as well as CUDA. In training, the mean and the variance that normalise each channel are
those of the union of all ranks' batches, each rank weighing by its number of rows (which
may differ, and may be 0). The running statistics are updated from those global values, the
variance unbiased with the global count, so they stay the same on every rank.

How: two differentiable sums over the ranks (``allreduce_sum``, by default
``hvd.allreduce(t, op=hvd.Sum)``): the per-channel sums with the row count, which give the
mean; then the per-channel sums of squared deviations from that mean, which give the
variance. Autograd differentiates through both (the gradient of a sum over ranks is the sum
over ranks of the gradients), so the backward pass runs the same two reductions, in reverse
order, and the input, weight and bias gradients are those of one batch norm over the
concatenated batch (the weight and bias gradients are this rank's share: the optimizer's
allreduce adds the shares). Two passes rather than one sum of squares: ``E[x²] - E[x]²``
cancels catastrophically when the mean is large against the spread; this costs one more
latency per layer.

Deadlock hazards, as with any collective: every rank must run the forward pass of each
``SyncBatchNorm`` in the same order, and the backward pass too — a rank with 0 rows included
(its loss is 0, but must still depend on the output so that ``backward`` reaches the
layer). An input that requires grad on some ranks and not on others splits them in
backward: use the same model everywhere.
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

#: The name the default reduction gives its collectives (the timeline's row, the mismatch
#: message's call).
NAME = "sync_batch_norm"


def horovod_sum(tensor):
    """The sum of ``tensor`` over the ranks of ``hpctrain.torch``, differentiable.

    Synchronisation point: ``hvd.allreduce`` (needs ``hvd.init()``).
    """
    import hpctrain.torch as hvd   # late: hvd's modules may move, and hvd imports torch

    return hvd.allreduce(tensor, op=hvd.Sum, name=NAME)


class SyncBatchNorm(_BatchNorm):
    """Batch norm over ``(N, C)``, ``(N, C, L)``, ``(N, C, H, W)`` or ``(N, C, D, H, W)``
    input whose training statistics are those of every rank's batch together.

    ``num_features, eps, momentum, affine, track_running_stats``: as Horovod's and torch's
    (``momentum=None``: a cumulative average). ``allreduce_sum(tensor) -> tensor``: a
    differentiable sum over the ranks, with a gradient that is the sum of the ranks'
    gradients; ``None``: :func:`horovod_sum`. ``device``, ``dtype``: of the parameters and
    buffers, as in torch.

    Which calls synchronise: in training, and in evaluation without running statistics (as
    Horovod does: there are no other statistics to use), ``forward`` makes two
    ``allreduce_sum`` calls and the backward pass two more. In evaluation with running
    statistics it is plain batch norm on this rank, with no communication.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, *, allreduce_sum=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.allreduce_sum = allreduce_sum or horovod_sum

    def _check_input_dim(self, input):
        if not 2 <= input.dim() <= 5:
            raise ValueError(f"SyncBatchNorm expects 2-D to 5-D input (N, C, ...), got "
                             f"{input.dim()}-D input of shape {tuple(input.shape)}")
        if input.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm({self.num_features}) got input with "
                             f"{input.shape[1]} channels (shape {tuple(input.shape)}): "
                             f"dimension 1 must hold the {self.num_features} features")

    def forward(self, input):
        """Normalise ``input``; see the class docstring for when this synchronises."""
        self._check_input_dim(input)
        factor = self._running_factor()
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, False, 0.0, self.eps)
        return self._synchronised(input, factor)

    def _running_factor(self):
        """The weight of this batch in the running statistics (counts the batch)."""
        if not (self.training and self.track_running_stats):
            return 0.0
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def _synchronised(self, input, factor):
        channels = input.shape[1]
        dims = [0, *range(2, input.dim())]
        shape = (1, channels) + (1,) * (input.dim() - 2)
        # Half precision is summed in float32: its integers stop at 2048 rows.
        work = input if input.dtype in (torch.float32, torch.float64) else input.float()
        rows = input.numel() // channels
        sums = self.allreduce_sum(torch.cat([work.sum(dims), work.new_tensor([rows])]))
        count = round(sums[-1].item())   # the same on every rank: so is any error below
        if count <= 1:
            raise ValueError(f"SyncBatchNorm expects more than 1 value per channel over all "
                             f"ranks when training, got {count} ({rows} on this rank, input "
                             f"shape {tuple(input.shape)}): give the ranks larger batches")
        mean = sums[:channels] / count
        centred = work - mean.view(shape)
        squares = self.allreduce_sum(centred.square().sum(dims))
        var = squares / count
        out = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.weight is not None:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.training and self.running_mean is not None:
            self._update_running(mean.detach(), squares.detach() / (count - 1), factor)
        return out.to(input.dtype)

    @torch.no_grad()
    def _update_running(self, mean, unbiased_var, factor):
        self.running_mean.mul_(1.0 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
        self.running_var.mul_(1.0 - factor).add_(unbiased_var.to(self.running_var.dtype),
                                                 alpha=factor)
