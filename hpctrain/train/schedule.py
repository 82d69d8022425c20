"""The learning rate: linear scaling with the global batch and gradual warm-up.

Goyal et al. 2017 ("Accurate, Large Minibatch SGD"): when the global batch grows k-fold,
multiply the learning rate by k (*linear scaling rule*); because a large rate diverges early
in training, reach it gradually, raising it linearly at every step from the small-batch rate
to the scaled rate over the first epochs (*gradual warm-up*; they used 5 epochs).

Here ``lr`` is the rate meant for a global batch of ``base_batch_size``; with
``lr_scaling = "linear"`` the target rate is ``lr × global batch / base_batch_size``, and
``warmup_epochs`` ramps from ``lr`` to the target. After warm-up, ``lr_decay = "cosine"``
lowers the rate along half a cosine to zero at the last step; ``"none"`` keeps it.
"""

import math


def target_lr(lr, global_batch, base_batch, scaling):
    """The learning rate after warm-up."""
    return lr * global_batch / base_batch if scaling == "linear" else lr


class WarmupSchedule:
    """``schedule(step)`` → the learning rate of that step (0-based)."""

    def __init__(self, start_lr, target, warmup_steps, total_steps=0, decay="none"):
        self.start_lr, self.target, self.warmup_steps = start_lr, target, warmup_steps
        self.total_steps, self.decay = total_steps, decay

    def __call__(self, step):
        if step < self.warmup_steps:
            return self.start_lr + (self.target - self.start_lr) * step / self.warmup_steps
        if self.decay != "cosine" or self.total_steps <= self.warmup_steps:
            return self.target
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        return self.target * 0.5 * (1.0 + math.cos(math.pi * progress))
