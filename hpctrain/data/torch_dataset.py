"""A torch ``Dataset`` from ``--dataset package.module:factory``, read like an HDF5 file.

The factory takes no argument and returns a map-style ``Dataset`` whose items are
``(sample, label)`` pairs: a sample tensor or array of one fixed shape, an integer label.
The number of classes is the data set's ``classes`` (a list) or ``num_classes`` attribute,
else one more than the largest label (a pass over all items, on every rank alike).
"""

import numpy as np

from ..errors import UsageError
from .. import plugins


class TorchDataset:
    """``read(rows)``, ``sample_shape``, ``num_classes`` and ``len`` over a torch Dataset."""

    def __init__(self, spec):
        self.spec = spec
        made = plugins.load(spec, "--dataset")
        try:
            self.dataset = made()
        except Exception as exc:  # noqa: BLE001 - the user's factory failed
            raise UsageError(f"--dataset {spec!r}: the factory failed: "
                             f"{type(exc).__name__}: {exc}") from None
        if not hasattr(self.dataset, "__getitem__") or not hasattr(self.dataset, "__len__"):
            raise UsageError(f"--dataset {spec!r}: the factory returned "
                             f"{type(self.dataset).__name__}, not a map-style Dataset "
                             f"(with __getitem__ and __len__)")
        if len(self.dataset) == 0:
            raise UsageError(f"--dataset {spec!r}: the data set is empty")
        x, _ = self._item(0)
        self.sample_shape = tuple(x.shape)
        self.num_classes = self._classes()

    def _item(self, index):
        item = self.dataset[int(index)]
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise UsageError(f"--dataset {self.spec!r}: item {index} is not a (sample, label) "
                             f"pair")
        x, y = item
        return np.asarray(x, dtype=np.float32), int(y)

    def _classes(self):
        for name in ("classes", "num_classes"):
            value = getattr(self.dataset, name, None)
            if value is not None:
                return len(value) if name == "classes" else int(value)
        return 1 + max(self._item(i)[1] for i in range(len(self.dataset)))

    def __len__(self):
        return len(self.dataset)

    def read(self, rows):
        """Samples (float32) and labels (int64) of ``rows``, in the order given."""
        items = [self._item(i) for i in np.asarray(rows, dtype=np.int64)]
        if not items:
            return (np.empty((0, *self.sample_shape), np.float32), np.empty(0, np.int64))
        return (np.stack([x for x, _ in items]), np.array([y for _, y in items], np.int64))

    def close(self):
        """Nothing to release."""


__all__ = ["TorchDataset"]
