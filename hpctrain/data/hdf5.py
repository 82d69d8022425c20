"""Data sets stored as two HDF5 datasets: samples ``x`` (rows × sample shape) and labels ``y``.

Any HDF5 file works if it holds a float sample array and a 1-D integer label array with the
same number of rows; their names are options (``x`` and ``y`` by default). Labels are class
indices 0 … classes-1: ``classes`` is the label array's attribute of that name, or the
largest label + 1. A rank reads only
the rows of its own batches: h5py's fancy indexing reads a list of rows in one call but needs
the indices strictly increasing, so ``read`` sorts and de-duplicates them, reads, and puts the
rows back in the order asked for (padding may repeat a row within a batch).
"""

import contextlib
from pathlib import Path

import numpy as np

from ..errors import UsageError
from .atomic import atomic_path


class HDF5Dataset:
    """The ``x``/``y`` rows of an HDF5 file, opened read-only; ``read(rows)`` loads a batch.

    Raises ``UsageError`` if the file is missing, not HDF5, lacks the named datasets or holds
    arrays of the wrong kind or labels out of range; the message names what the file does
    contain. Every rank opening the file checks all labels (a pass over the small 1-D label
    array, in chunks), so every rank reaches the same verdict without a collective.
    """

    def __init__(self, path, x="x", y="y"):
        import h5py

        self.path = Path(path)
        if not self.path.is_file():
            raise UsageError(f"data file {str(self.path)!r} does not exist (prepare one with "
                             f"'hpctrain data prepare digits' or 'hpctrain data synthetic')")
        try:
            self._file = h5py.File(self.path, "r")
        except OSError as exc:
            raise UsageError(f"data file {str(self.path)!r} is not a readable HDF5 file "
                             f"({exc}): --data needs an HDF5 file with samples and labels, "
                             f"as 'hpctrain data synthetic' writes") from None
        try:
            self._x, self._y = self._dataset(x, "x"), self._dataset(y, "y")
            _check_arrays(self.path, self._x, self._y)
            self.num_classes = _check_labels(self.path, self._y)
        except UsageError:
            self.close()
            raise
        self.sample_shape = tuple(self._x.shape[1:])

    def __len__(self):
        return self._x.shape[0]

    def read(self, rows):
        """Samples (float32) and labels (int64) of ``rows``, in the order given."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return (np.empty((0, *self.sample_shape), np.float32), np.empty(0, np.int64))
        unique, inverse = np.unique(rows, return_inverse=True)
        x = np.asarray(self._x[unique], dtype=np.float32)
        y = np.asarray(self._y[unique], dtype=np.int64)
        return x[inverse], y[inverse]

    def close(self):
        """Close the file."""
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _dataset(self, name, option):
        import h5py

        found = self._file.get(name)
        if not isinstance(found, h5py.Dataset):
            names = _dataset_names(self._file)
            raise UsageError(f"data file {str(self.path)!r} has no dataset {name!r} (option "
                             f"'{option}'); it holds: {', '.join(names) or 'no datasets'}")
        return found

def _check_arrays(path, x, y):
    if x.ndim < 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise UsageError(f"data file {str(path)!r}: samples {x.name} {x.shape} and labels "
                         f"{y.name} {y.shape} must be (rows, ...) and (rows,) with equal rows")
    if x.shape[0] == 0:
        raise UsageError(f"data file {str(path)!r} holds no samples: {x.name} and {y.name} "
                         f"have 0 rows; training needs at least one")
    if not np.issubdtype(y.dtype, np.integer):
        raise UsageError(f"data file {str(path)!r}: labels {y.name} must be integers, "
                         f"not {y.dtype}")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise UsageError(f"data file {str(path)!r}: samples {x.name} must be numbers, "
                         f"not {x.dtype}")


#: Labels read at a time while checking them (8 MB of int64).
LABEL_CHUNK = 1 << 20


def _check_labels(path, y):
    # Returns the number of classes. A label out of range would otherwise surface as a
    # torch error in the middle of a step, on the one rank whose batch holds it.
    low, high = _label_range(y)
    given = "classes" in y.attrs
    classes = int(y.attrs["classes"]) if given else high + 1
    if low < 0 or high >= classes:
        valid = (f"0 to {classes - 1} (its attribute 'classes' is {classes})" if given else
                 ">= 0 (without a 'classes' attribute, classes = the largest label + 1)")
        raise UsageError(f"data file {str(path)!r}: labels {y.name} must be class indices "
                         f"{valid}, but they range from {low} to {high}")
    return classes


def _label_range(y):
    low, high = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    for start in range(0, y.shape[0], LABEL_CHUNK):
        chunk = y[start:start + LABEL_CHUNK]
        low, high = min(low, int(chunk.min())), max(high, int(chunk.max()))
    return low, high


def _dataset_names(group):
    import h5py

    names = []
    group.visititems(lambda name, item: names.append(name)
                     if isinstance(item, h5py.Dataset) else None)
    return names


@contextlib.contextmanager
def create_file(path, rows, sample_shape, *, classes, **attrs):
    """Yield empty ``x`` (float32) and ``y`` (int64) datasets to fill; publish atomically.

    The file appears at ``path`` only when the body finishes without error (temporary file +
    fsync + rename), so a reader never opens a half-written data set. Extra keyword arguments
    become file attributes; ``classes`` is kept on ``y``.
    """
    import h5py

    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        x = f.create_dataset("x", shape=(rows, *sample_shape), dtype=np.float32)
        y = f.create_dataset("y", shape=(rows,), dtype=np.int64)
        y.attrs["classes"] = classes
        for key, value in attrs.items():
            f.attrs[key] = value
        yield x, y


def write_arrays(path, x, y, *, classes, **attrs):
    """Write samples ``x`` and labels ``y`` to a new HDF5 file at ``path`` (atomically)."""
    x = np.asarray(x, dtype=np.float32)
    with create_file(path, x.shape[0], x.shape[1:], classes=classes, **attrs) as (dx, dy):
        dx[...] = x
        dy[...] = np.asarray(y, dtype=np.int64)
    return Path(path)
