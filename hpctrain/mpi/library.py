"""Which MPI library is under mpi4py, and which standard it implements."""


def library_version():
    """The MPI library's own one-line version string, e.g. ``Open MPI v4.1.4, ...``."""
    from mpi4py import MPI

    return MPI.Get_library_version().strip("\x00 \n").splitlines()[0].strip()


def standard_version():
    """The MPI standard version the library implements, e.g. ``3.1``."""
    from mpi4py import MPI

    return "%d.%d" % MPI.Get_version()
