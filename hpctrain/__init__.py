"""hpctrain: data-parallel training on HPC clusters with MPI and Horovod.

Launch with ``mpirun -np N python -m hpctrain SUBCOMMAND`` (or ``srun``); ``--help`` lists
the subcommands.
"""

__version__ = "0.1.0"
