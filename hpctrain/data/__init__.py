"""Data sets in HDF5: reading the rows of a rank's batches, and writing the data sets we ship.

- ``hdf5``: ``HDF5Dataset`` reads only the rows it is asked for; ``write_arrays`` writes one.
- ``split``: the seeded train/validation split of a file's rows.
- ``digits``: scikit-learn's bundled handwritten digits, the default data set.
- ``synthetic``: class-structured random data of any size and shape.
- ``cli``: the ``hpctrain data`` subcommand.
"""

from .hdf5 import HDF5Dataset, write_arrays
from .split import split_indices

__all__ = ["HDF5Dataset", "write_arrays", "split_indices"]
