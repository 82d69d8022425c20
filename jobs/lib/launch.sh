# Sourced by every batch script in jobs/: finds the project's Python environment and defines
# `launch COMMAND...`, which starts COMMAND once per task of the allocation.
#
# Submit from the project's root (sbatch copies the script, so it cannot find its own folder):
#   cd hpctrain && sbatch jobs/train-cpu.sbatch
# Environment read here:
#   HPCTRAIN_VENV      a virtual environment to activate (default: ./.venv when it exists)
#   HPCTRAIN_LAUNCHER  srun (default) or mpirun
#   HPCTRAIN_ARGS      extra arguments for the hpctrain subcommand of the job

cd "${SLURM_SUBMIT_DIR:-.}" || exit 1
if [ -n "${HPCTRAIN_VENV:-}" ]; then
    # shellcheck disable=SC1091 # the environment is the user's
    source "$HPCTRAIN_VENV/bin/activate"
elif [ -f .venv/bin/activate ]; then
    source .venv/bin/activate
fi

launch() {
    case ${HPCTRAIN_LAUNCHER:-srun} in
        # srun starts one task per rank and wires them up through PMIx: no hostfile, and the
        # counts come from the allocation (SLURM_NTASKS, SLURM_NTASKS_PER_NODE).
        srun) srun --mpi=pmix "$@" ;;
        # Open MPI's mpirun reads the Slurm allocation itself; -np is given only so that the
        # log shows it. --bind-to none leaves placement to Slurm's --cpus-per-task.
        mpirun) mpirun -np "$SLURM_NTASKS" --bind-to none "$@" ;;
        *) echo "HPCTRAIN_LAUNCHER must be srun or mpirun, got '$HPCTRAIN_LAUNCHER'" >&2
           return 2 ;;
    esac
}

echo "# job $SLURM_JOB_ID: $SLURM_NTASKS tasks on $SLURM_JOB_NUM_NODES node(s): $SLURM_JOB_NODELIST"
