"""NaN and Inf in a step: each rank's verdict, and the message every rank agrees on.

A rank whose loss or gradients are not finite must not stop alone: the others would wait in
the next step's allreduce forever. The loop therefore gathers every rank's verdict (one byte)
and all ranks stop (``--nonfinite error``) or skip the update (``skip``) together.
"""

import math

import numpy as np
import torch

LOSS, GRADIENTS = 1, 2  # bits of a verdict


class NonFiniteError(RuntimeError):
    """A NaN or Inf loss or gradient under ``--nonfinite error``."""


def verdict(loss, gradients):
    """``LOSS | GRADIENTS`` bits for a non-finite ``loss`` (a float) or ``gradients``; or 0."""
    bad = 0 if math.isfinite(loss) else LOSS
    if not all(bool(torch.isfinite(g).all()) for g in gradients):
        bad |= GRADIENTS
    return bad


def describe(verdicts):
    """``non-finite loss on rank(s) [1]; non-finite gradients on rank(s) [0, 1]``."""
    verdicts = np.asarray(verdicts)
    return "; ".join(f"non-finite {name} on rank(s) {np.flatnonzero(verdicts & bit).tolist()}"
                     for bit, name in ((LOSS, "loss"), (GRADIENTS, "gradients"))
                     if (verdicts & bit).any())
