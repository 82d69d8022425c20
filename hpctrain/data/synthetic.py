"""Synthetic classification data of any size and sample shape, learnable but not trivial.

Each class has a random prototype (standard normal, one value per feature); a sample is its
class's prototype plus Gaussian noise of standard deviation ``noise``. Rows are generated
and written in chunks, so the data set may be larger than memory.
"""

import numpy as np

from .. import faults
from ..errors import UsageError
from .hdf5 import create_file

CHUNK_ROWS = 4096


def parse_shape(text):
    """``"1x28x28"`` → ``(1, 28, 28)``; raises ``UsageError`` on anything else."""
    parts = text.lower().replace("×", "x").split("x")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"bad sample shape {text!r}: expected positive integers joined "
                         f"by 'x', e.g. 1x28x28 or 64")
    return tuple(int(p) for p in parts)


def write(path, samples, shape, classes, *, seed=0, noise=1.0):
    """Write ``samples`` rows of ``shape`` over ``classes`` classes to ``path`` (atomically)."""
    if samples < 1 or classes < 2 or noise < 0:
        raise UsageError(f"synthetic data needs samples >= 1 (got {samples}), classes >= 2 "
                         f"(got {classes}) and noise >= 0 (got {noise})")
    rng = np.random.default_rng(seed)
    prototypes = rng.standard_normal((classes, *shape)).astype(np.float32)
    with create_file(path, samples, shape, classes=classes, source="hpctrain synthetic",
                     seed=seed, noise=noise) as (x, y):
        for start in range(0, samples, CHUNK_ROWS):
            stop = min(start + CHUNK_ROWS, samples)
            labels = rng.integers(classes, size=stop - start)
            noise_rows = rng.standard_normal((stop - start, *shape), dtype=np.float32)
            x[start:stop] = prototypes[labels] + np.float32(noise) * noise_rows
            y[start:stop] = labels
            if start == 0:
                faults.inject("data.write", 0)  # half written: nothing may appear at path
    return path
