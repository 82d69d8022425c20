"""Starting MPI: mpi4py's ``MPI`` module with MPI initialised at the thread level the
communication thread needs, or a sentence saying what it gave instead."""


def start(required=None):
    """mpi4py's ``MPI`` module, with MPI started: by mpi4py at import (its default), or here
    when the script set ``mpi4py.rc.initialize = False`` first (as Horovod's documentation
    shows), at ``required`` (default ``MPI_THREAD_MULTIPLE``) and finalised at exit (after
    any shutdown registered later, since ``atexit`` runs in reverse).

    Returns ``(MPI, why)``: ``why`` says what MPI gave when it gave less than ``required``
    (``None`` otherwise). A finalised MPI cannot start again: ``RuntimeError`` saying so.
    """
    import atexit

    import mpi4py
    from mpi4py import MPI

    required = MPI.THREAD_MULTIPLE if required is None else required
    if MPI.Is_finalized():
        raise RuntimeError("MPI has been finalized in this process and cannot start again: "
                           "init must come before MPI.Finalize()")
    if not MPI.Is_initialized():
        MPI.Init_thread(required)
        if not mpi4py.rc.finalize:
            atexit.register(lambda: MPI.Is_finalized() or MPI.Finalize())
    provided = MPI.Query_thread()
    if provided >= required:
        return MPI, None
    names = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
             MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED",
             MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE"}
    return MPI, (f"MPI gives {names.get(provided, provided)}, less than "
                 f"{names.get(required, required)}: the communication thread calls MPI beside "
                 f"this one, so a script that calls MPI itself while operations are in "
                 f"flight may crash (build MPI with thread support, or start it with "
                 f"MPI.Init_thread(MPI.THREAD_MULTIPLE))")
