"""The default data set: scikit-learn's handwritten digits, written once into HDF5.

1,797 grey-scale 8×8 images of the digits 0–9, shipped inside scikit-learn (no download).
Pixels (0–16) are scaled to [0, 1] and stored as ``x`` (1797, 1, 8, 8) float32 with labels
``y`` (1797,) int64. A missing file named ``digits.h5`` is prepared on first use.
"""

from pathlib import Path

import numpy as np

from .hdf5 import write_arrays

#: Where ``hpctrain train`` looks for the data by default, relative to the current directory.
DEFAULT_PATH = "data/digits.h5"
FILENAME = "digits.h5"


def load_arrays():
    """The digits as ``(x, y)``: float32 (N, 1, 8, 8) in [0, 1] and int64 (N,)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
    return x, bunch.target.astype(np.int64)


def prepare(path=DEFAULT_PATH):
    """Write the digits to ``path`` (atomically) and return the path."""
    x, y = load_arrays()
    return write_arrays(path, x, y, classes=10, source="sklearn.datasets.load_digits",
                        description="handwritten digits, 8x8, pixels scaled to [0, 1]")


def is_auto_prepared(path):
    """True for the paths that ``ensure`` prepares when missing: files named ``digits.h5``."""
    return Path(path).name == FILENAME


def ensure(path, comm):
    """Collective: rank 0 writes the digits to ``path`` if it is missing; all ranks wait.

    Synchronisation point: the barrier. Every rank must call this with the same ``path``
    (ranks decide from the configuration alone, never from what each one sees on disk, so
    they all reach the barrier). Rank 0 publishes the file atomically before it arrives, so
    after the barrier every rank can open it. Returns True when rank 0 wrote the file.
    """
    wrote = False
    if comm.Get_rank() == 0 and not Path(path).exists():
        prepare(path)
        wrote = True
    comm.Barrier()
    return wrote
