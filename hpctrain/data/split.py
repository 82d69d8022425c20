"""The train/validation split: a seeded, deterministic partition of a file's rows.

Every rank computes the same split from the same seed, without communicating. The rows of
each part are sorted so that reads of neighbouring positions touch neighbouring rows.
"""

import numpy as np


def split_indices(num_rows, val_fraction, seed=0):
    """``(train_rows, val_rows)``: ``round(val_fraction · num_rows)`` rows for validation.

    The same arguments give the same split on every rank and in every run.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    order = np.random.default_rng(seed).permutation(num_rows)
    num_val = int(round(val_fraction * num_rows))
    return np.sort(order[num_val:]), np.sort(order[:num_val])
