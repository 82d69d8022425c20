# Sourced by every batch script in jobs/: finds the project's Python environment and defines
# `launch COMMAND...`, which starts COMMAND once per task of the allocation.
#
# Submit from the project's root (sbatch copies the script, so it cannot find its own folder):
#   cd hpctrain && sbatch jobs/train-cpu.sbatch
# Environment read here:
#   HPCTRAIN_VENV      a virtual environment to activate (default: ./.venv when it exists)
#   HPCTRAIN_LAUNCHER  srun (default) or mpirun
#   HPCTRAIN_ARGS      extra arguments for the hpctrain subcommand of the job
#   HPCTRAIN_TAG_OUTPUT  1: each line of the job's output tagged with its rank ([R]<stdout>:)

cd "${SLURM_SUBMIT_DIR:-.}" || exit 1
if [ -n "${HPCTRAIN_VENV:-}" ]; then
    # shellcheck disable=SC1091 # the environment is the user's
    source "$HPCTRAIN_VENV/bin/activate"
elif [ -f .venv/bin/activate ]; then
    source .venv/bin/activate
fi

# Open MPI's flags for a job of one rank per task (Horovod's recommended launch): -bind-to
# none leaves CPU placement to Slurm's --cpus-per-task (Open MPI's own binding, to a core or
# a socket, can squeeze a rank's threads onto one core); -map-by slot gives each node's tasks
# consecutive ranks, as srun does; -x hands PATH and LD_LIBRARY_PATH (this job's environment)
# to the ranks on every node. The transport stays Open MPI's choice, or OMPI_MCA_pml's.
mpirun_flags=(-bind-to none -map-by slot -x PATH -x LD_LIBRARY_PATH)
# hpctrain's settings for the ranks (HPCTRAIN_ALLREDUCE, HPCTRAIN_SEGMENT_BYTES, ...), those
# this job has: srun hands every task the whole environment, mpirun only what -x names. The
# job's own (HPCTRAIN_ARGS, HPCTRAIN_VENV, HPCTRAIN_LAUNCHER) are read here, not by ranks.
for name in $(compgen -e); do
    case $name in
        HPCTRAIN_ARGS | HPCTRAIN_VENV | HPCTRAIN_LAUNCHER | HPCTRAIN_TAG_OUTPUT) ;;
        HPCTRAIN_*) mpirun_flags+=(-x "$name") ;;
    esac
done

# job_gpus: the GPUs the allocation gave this node, whichever option asked for them
# (--gpus-per-task, --gpus-per-node, --gres=gpu:N, --gpus); 0 in a CPU job.
job_gpus() {
    echo "${SLURM_GPUS_ON_NODE:-0}"
}

# launcher_prefix: the launcher as a command prefix that takes -np N, for a program that
# starts its own steps (jobs/study.sbatch); for srun the bare name, which the study completes
# with --mpi=pmix and the step's node and task counts.
launcher_prefix() {
    case ${HPCTRAIN_LAUNCHER:-srun} in
        srun) echo srun ;;
        mpirun) echo "mpirun ${mpirun_flags[*]}" ;;
        *) launcher_error; return 2 ;;
    esac
}

launcher_error() {
    echo "HPCTRAIN_LAUNCHER must be srun or mpirun, got '$HPCTRAIN_LAUNCHER'" >&2
}

# relay: the command prefix that passes a step's output through hpctrain.launch.output: each
# line tagged with its rank when HPCTRAIN_TAG_OUTPUT=1 (as the ranks wrote it otherwise), and
# after a failed step one root-cause block: the first rank to fail, its host, its exit status
# or signal and the first lines of its error. Nothing where the environment lacks hpctrain.
relay() {
    if python -c 'import hpctrain.launch.output' >/dev/null 2>&1; then
        local tag=--no-tag-output
        [ "${HPCTRAIN_TAG_OUTPUT:-0}" = 1 ] && tag=--tag-output
        echo python -m hpctrain.launch.output "$tag" --
    fi
}

launch() {
    local gpu_bind=() watch
    read -ra watch <<< "$(relay)"
    # In a GPU job every task sees all of its node's GPUs (--gpu-bind=none), so that a rank
    # takes the one of its node-local rank (`torch.cuda.set_device(hvd.local_rank())`,
    # `--device cuda`) and reaches the others directly (CUDA IPC); under --gpus-per-task Slurm
    # would show each task its own GPU only, as device 0, and local rank 1 would find no GPU 1.
    # A --gpu-bind that the job gives (SLURM_GPU_BIND) is kept.
    if [ "$(job_gpus)" -gt 0 ]; then gpu_bind=("--gpu-bind=${SLURM_GPU_BIND:-none}"); fi
    case ${HPCTRAIN_LAUNCHER:-srun} in
        # srun starts one task per rank and wires them up through PMIx: no hostfile, and the
        # counts come from the allocation (SLURM_NTASKS, SLURM_NTASKS_PER_NODE). A task that
        # exits non-zero ends the whole step at once (--kill-on-bad-exit): its peers would
        # otherwise wait for it in a collective until the time limit.
        srun) "${watch[@]}" srun --mpi=pmix --kill-on-bad-exit=1 "${gpu_bind[@]}" "$@" ;;
        # Open MPI's mpirun reads the Slurm allocation itself; -np is given only so that the
        # log shows it. mpirun ends the job when one rank fails. It starts its daemons with
        # srun, one task per node, which would read SLURM_GPUS_PER_TASK (--gpus-per-task=1)
        # and give each daemon, and so all the ranks of its node, one GPU; without it the
        # daemons' step gets every GPU of the job (srun's default).
        mpirun) env -u SLURM_GPUS_PER_TASK "${watch[@]}" \
                    mpirun -np "$SLURM_NTASKS" "${mpirun_flags[@]}" "$@" ;;
        *) launcher_error; return 2 ;;
    esac
}

echo "# job $SLURM_JOB_ID: $SLURM_NTASKS tasks on $SLURM_JOB_NUM_NODES node(s): $SLURM_JOB_NODELIST"
