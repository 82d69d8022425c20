"""What hpctrain knows about the MPI under mpi4py, one concept a module: which library it is
(:mod:`.library`), whether it takes GPU buffers (:mod:`.cuda`), how a rank waits in it
(:mod:`.waiting`), whether it survives a lost rank (:mod:`.ulfm`), and starting it
(:mod:`.init`). Importing the package loads none of them, nor mpi4py."""
