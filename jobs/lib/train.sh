# Sourced by the train batch scripts after launch.sh: `train_job [OPTIONS...]` starts
# `hpctrain train` on every task with what the allocation says, then HPCTRAIN_ARGS.
#
# - --threads: torch threads per rank = the cores Slurm gave each task (--cpus-per-task);
# - --progress never: mpirun and srun hand ranks a terminal-less or pseudo stdout, and a
#   redrawn progress bar only clutters the job's output file;
# - --run-dir: metrics.csv, config.toml and checkpoints of this job, named after it, in the
#   submit directory (a shared file system on a cluster; checkpoints are written by rank 0).

train_job() {
    # Word splitting of HPCTRAIN_ARGS is intended: it holds several options.
    # shellcheck disable=SC2086
    launch python -m hpctrain train \
        --threads "${SLURM_CPUS_PER_TASK:-1}" \
        --progress never \
        --run-dir "runs/$SLURM_JOB_NAME-$SLURM_JOB_ID" \
        "$@" ${HPCTRAIN_ARGS:-}
}
