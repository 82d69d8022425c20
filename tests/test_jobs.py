"""The launch files users copy: Slurm batch scripts and the Kubernetes MPIJob."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "jobs"


def sbatch_options(script):
    return dict(re.findall(r"^#SBATCH --([\w-]+)=?(\S*)", script.read_text(), re.M))


def repeated_counts(options):
    """What a header says twice: counts that another count already fixes, so that a user who
    edits one must find and edit the other (empty when every count is written once)."""
    repeated = []
    if "ntasks" in options and "ntasks-per-node" in options:
        repeated.append("--ntasks repeats --nodes x --ntasks-per-node")
    gpus = [f"--{key}" for key in ("gpus-per-node", "gpus", "ntasks-per-gpu") if key in options]
    gpus += ["--gres"] if "gpu" in options.get("gres", "") else []
    if gpus and ("ntasks-per-node" in options or "ntasks" in options):
        repeated.append(f"{gpus[0]} repeats the task count: one rank per GPU is "
                        f"--gpus-per-task=1 beside the task count")
    return repeated


@pytest.mark.parametrize("script", sorted(JOBS.glob("*.sbatch")), ids=lambda p: p.name)
def test_batch_scripts_take_counts_from_slurm(script):
    text = script.read_text()
    options = sbatch_options(script)
    for key in ("job-name", "nodes", "ntasks-per-node", "time", "output"):
        assert key in options, f"{script.name}: #SBATCH --{key} missing"
    assert "source jobs/lib/launch.sh" in text
    assert not re.search(r"-np \d|-n \d|--ntasks=\d", text), "counts come from the allocation"
    assert repeated_counts(options) == [], f"{script.name}: a count written twice"
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)


@pytest.mark.parametrize("header, twice", [
    ({"nodes": "1", "ntasks-per-node": "4", "gpus-per-node": "4"}, True),
    ({"nodes": "1", "ntasks-per-node": "4", "gres": "gpu:a100:4"}, True),
    ({"nodes": "2", "ntasks-per-node": "4", "ntasks": "8"}, True),
    ({"nodes": "1", "ntasks-per-node": "4", "ntasks-per-gpu": "1"}, True),
    ({"nodes": "1", "ntasks-per-node": "4", "gpus-per-task": "1"}, False),
    ({"nodes": "1", "ntasks-per-node": "4", "cpus-per-task": "4"}, False),
])
def test_a_count_written_twice_is_caught(header, twice):
    assert bool(repeated_counts(header)) == twice


# --- the scripts run outside Slurm: launchers replaced by stubs that print their argv ----------

@pytest.fixture
def job_env(tmp_path):
    """Environment in which a batch script runs here as in a 2-node x 3-task allocation, with
    srun, mpirun and python stubs (first on PATH through a fake venv) that print their argv,
    and on a second line the GPUs per task that an srun they start would read."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("srun", "mpirun", "python"):
        # python -c: an environment without hpctrain, whose steps start bare (the relay of
        # their output is tested on its own below).
        check = ('case "$*" in *hpctrain.launch.output*) exit 1;; esac\n'
                 if name == "python" else "")
        (stubs / name).write_text(f'#!/bin/sh\n{check}echo "{name} $*"\n'
                                  f'echo "{name} sees SLURM_GPUS_PER_TASK=$SLURM_GPUS_PER_TASK"\n')
        (stubs / name).chmod(0o755)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'PATH="{stubs}:$PATH"\n')
    return {"PATH": os.environ["PATH"], "HPCTRAIN_VENV": str(venv), "SLURM_SUBMIT_DIR": str(REPO),
            "SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "job", "SLURM_NTASKS": "6",
            "SLURM_NTASKS_PER_NODE": "3(x2)", "SLURM_TASKS_PER_NODE": "3(x2)",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_CPUS_PER_TASK": "2"}


#: Arguments a batch script needs after its name (the user's script of jobs/run.sbatch).
SCRIPT_ARGS = {"run.sbatch": ["examples/horovod_style.py", "--epochs", "2"]}


def run_job(script, env, launcher=None, args=None):
    """Run the batch script with bash, as sbatch would on the first node; its output."""
    env = {**env, **({"HPCTRAIN_LAUNCHER": launcher} if launcher else {})}
    args = SCRIPT_ARGS.get(script.name, []) if args is None else args
    return subprocess.run(["bash", str(script), *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60)


MPIRUN_FLAGS = "-bind-to none -map-by slot -x PATH -x LD_LIBRARY_PATH"


def test_srun_ends_the_step_when_one_task_fails(job_env):
    done = run_job(JOBS / "info.sbatch", job_env)
    assert done.returncode == 0, done.stderr
    assert "srun --mpi=pmix --kill-on-bad-exit=1 python -m hpctrain info\n" in done.stdout


@pytest.mark.parametrize("tag", ["", "1"])
def test_steps_pass_their_output_through_the_relay_where_hpctrain_is(job_env, tag):
    # A python that has hpctrain: the step runs under python -m hpctrain.launch.output, which
    # tags its lines (HPCTRAIN_TAG_OUTPUT=1) and sums up a failure.
    python = Path(job_env["HPCTRAIN_VENV"]).parent / "bin" / "python"
    python.write_text('#!/bin/sh\ncase "$*" in "-c import hpctrain"*) exit 0;; esac\n'
                      'echo "python $*"\n')
    for launcher in ("srun", "mpirun"):
        done = run_job(JOBS / "info.sbatch", {**job_env, "HPCTRAIN_TAG_OUTPUT": tag}, launcher)
        assert done.returncode == 0, done.stderr
        relay = f"python -m hpctrain.launch.output --{'' if tag else 'no-'}tag-output -- "
        assert f"{relay}{launcher} " in done.stdout, done.stdout


def test_mpirun_launch_carries_the_recommended_flags(job_env):
    done = run_job(JOBS / "info.sbatch", job_env, launcher="mpirun")
    assert done.returncode == 0, done.stderr
    assert f"mpirun -np 6 {MPIRUN_FLAGS} python -m hpctrain info\n" in done.stdout


@pytest.mark.parametrize("script", sorted(JOBS.glob("*.sbatch")), ids=lambda p: p.name)
def test_every_script_honours_the_launcher_choice(job_env, script):
    srun = run_job(script, job_env)
    assert srun.returncode == 0, srun.stderr
    assert "srun" in srun.stdout and "mpirun" not in srun.stdout, srun.stdout
    mpirun = run_job(script, job_env, launcher="mpirun")
    assert mpirun.returncode == 0, mpirun.stderr
    assert MPIRUN_FLAGS in mpirun.stdout and "srun" not in mpirun.stdout, mpirun.stdout
    wrong = run_job(script, job_env, launcher="ssh")
    assert wrong.returncode != 0
    assert "HPCTRAIN_LAUNCHER must be srun or mpirun, got 'ssh'" in wrong.stderr


def test_mpirun_daemons_get_every_gpu_of_the_node(job_env):
    # srun's tasks take one GPU each; mpirun's srun starts one daemon per node, which must
    # not be limited to one GPU for all the ranks it starts.
    gpu_job = {**job_env, "SLURM_GPUS_PER_TASK": "1"}
    srun = run_job(JOBS / "train-gpu.sbatch", gpu_job)
    assert "srun sees SLURM_GPUS_PER_TASK=1\n" in srun.stdout, srun.stdout + srun.stderr
    mpirun = run_job(JOBS / "train-gpu.sbatch", gpu_job, launcher="mpirun")
    assert "mpirun sees SLURM_GPUS_PER_TASK=\n" in mpirun.stdout, mpirun.stdout + mpirun.stderr


def test_study_job_hands_its_launcher_to_the_study(job_env):
    done = run_job(JOBS / "study.sbatch", job_env, launcher="mpirun")
    assert done.returncode == 0, done.stderr
    assert "# study at 3,6 ranks (3 per node)" in done.stdout
    assert (f"python -m hpctrain study allreduce --launcher mpirun {MPIRUN_FLAGS} --np 3,6 "
            f"--ranks-per-node 3 --out runs/job-7\n") in done.stdout


def test_study_job_of_one_task_per_node_starts_at_two_nodes(job_env):
    # An allreduce needs two ranks: 1 task per node sweeps 2, 4 nodes, not 1.
    one = {**job_env, "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "1(x4)",
           "SLURM_TASKS_PER_NODE": "1(x4)", "SLURM_JOB_NUM_NODES": "4"}
    done = run_job(JOBS / "study.sbatch", one)
    assert done.returncode == 0, done.stderr
    assert "--np 2,4 --ranks-per-node 1 " in done.stdout, done.stdout


# --- jobs/run.sbatch: the user's own script ---------------------------------------------------

def test_run_job_starts_the_users_script_with_its_arguments_under_the_guard(job_env):
    done = run_job(JOBS / "run.sbatch", job_env)
    assert done.returncode == 0, done.stderr
    assert ("srun --mpi=pmix --kill-on-bad-exit=1 python -m mpi4py examples/horovod_style.py "
            "--epochs 2\n") in done.stdout
    mpirun = run_job(JOBS / "run.sbatch", job_env, launcher="mpirun")
    assert (f"mpirun -np 6 {MPIRUN_FLAGS} python -m mpi4py examples/horovod_style.py "
            f"--epochs 2\n") in mpirun.stdout, mpirun.stdout


def test_run_job_without_the_guard_when_it_is_turned_off(job_env):
    done = run_job(JOBS / "run.sbatch", {**job_env, "HPCTRAIN_ABORT_ON_ERROR": "0"})
    assert done.returncode == 0, done.stderr
    assert "=1 python examples/horovod_style.py --epochs 2\n" in done.stdout, done.stdout


def test_mpirun_hands_hpctrains_settings_to_the_ranks(job_env):
    # srun passes the whole environment; mpirun only what -x names (hosts started over ssh).
    env = {**job_env, "HPCTRAIN_ALLREDUCE": "tree", "HPCTRAIN_SEGMENT_BYTES": "0",
           "HPCTRAIN_ARGS": "--epochs 1"}
    done = run_job(JOBS / "run.sbatch", env, launcher="mpirun")
    assert done.returncode == 0, done.stderr
    assert (f"mpirun -np 6 {MPIRUN_FLAGS} -x HPCTRAIN_ALLREDUCE -x HPCTRAIN_SEGMENT_BYTES "
            f"python -m mpi4py") in done.stdout, done.stdout


@pytest.mark.parametrize("args, error", [
    ([], "error: no script given: sbatch [OPTIONS] jobs/run.sbatch SCRIPT.py [ARGS...]"),
    (["no_such_script.py", "--epochs", "2"], f"error: no script 'no_such_script.py' in {REPO}"),
], ids=["no-script", "missing-script"])
def test_run_job_refuses_bad_input_before_any_rank_starts(job_env, args, error):
    for launcher in ("srun", "mpirun"):
        done = run_job(JOBS / "run.sbatch", job_env, launcher=launcher, args=args)
        assert done.returncode == 2, done.stdout + done.stderr
        assert error in done.stderr and done.stderr.count("error:") == 1, done.stderr
        assert launcher not in done.stdout, "a launch started after bad input"


def test_run_job_on_gpus_shows_every_task_its_nodes_gpus(job_env):
    gpus = {**job_env, "SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_TASK": "1"}
    done = run_job(JOBS / "run.sbatch", gpus)
    assert done.returncode == 0, done.stderr
    assert "python -c import horovod.torch" in done.stdout, "gpu-env.sh not sourced"
    assert "srun --mpi=pmix --kill-on-bad-exit=1 --gpu-bind=none python -m mpi4py " \
        in done.stdout, done.stdout
    # A binding the job asked for is its own.
    closest = run_job(JOBS / "run.sbatch", {**gpus, "SLURM_GPU_BIND": "closest"})
    assert "--gpu-bind=closest python" in closest.stdout, closest.stdout
    # A CPU job neither binds GPUs nor loads the GPU settings.
    cpu = run_job(JOBS / "run.sbatch", job_env)
    assert "--gpu-bind" not in cpu.stdout and "horovod.torch" not in cpu.stdout, cpu.stdout


def test_run_job_refuses_more_tasks_than_gpus_on_a_node(job_env):
    # --ntasks-per-node=3 --gpus-per-node=2: one rank per GPU cannot be.
    done = run_job(JOBS / "run.sbatch", {**job_env, "SLURM_GPUS_ON_NODE": "2",
                                         "SLURM_GPUS_PER_NODE": "2"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: 3 tasks on" in done.stderr and "but 2 GPUs" in done.stderr, done.stderr
    assert "srun" not in done.stdout


def test_mpijob_structure():
    job = yaml.safe_load((JOBS / "k8s" / "mpijob-train.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    spec = job["spec"]
    slots = spec["slotsPerWorker"]
    launcher = spec["mpiReplicaSpecs"]["Launcher"]
    worker = spec["mpiReplicaSpecs"]["Worker"]
    assert launcher["replicas"] == 1
    command = launcher["template"]["spec"]["containers"][0]["command"]
    # The operator's hostfile gives every worker slotsPerWorker slots: mpirun fills them all
    # with no -np, which would repeat replicas x slotsPerWorker.
    assert command[0] == "mpirun"
    assert not {"-np", "-n", "--np", "-c"} & set(command), command
    for flag in (["-bind-to", "none"], ["-map-by", "slot"], ["-x", "LD_LIBRARY_PATH"],
                 ["-x", "PATH"], ["-mca", "pml", "ob1"], ["-mca", "btl", "^openib"]):
        assert any(command[i:i + len(flag)] == flag for i in range(len(command))), flag
    assert command[-5:] == ["-m", "hpctrain", "train", "--device", "cuda"]
    limits = worker["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == slots


def test_shellcheck_jobs_and_scripts():
    # scripts/test installs shellcheck (as root on Debian); without it this fails rather than
    # skips.
    assert shutil.which("shellcheck"), "shellcheck missing: apt-get install shellcheck"
    scripts = [p for p in (REPO / "scripts").iterdir()
               if p.read_text().startswith("#!/usr/bin/env bash")]
    files = [*JOBS.glob("*.sbatch"), *JOBS.glob("lib/*.sh"), *scripts]
    subprocess.run(["shellcheck", "-x", "-s", "bash", *map(str, files)], check=True, cwd=REPO,
                   timeout=120)


@pytest.mark.parametrize("per_node, ranks, want", [
    ("4", 4, ["-N", "1"]), ("4", 5, ["-N", "2"]), ("4", 16, ["-N", "4"]),
    ("4(x3)", 8, ["-N", "2"]), ("", 8, []),
])
def test_study_srun_steps_take_the_fewest_nodes(per_node, ranks, want):
    from hpctrain.launch import srun_nodes

    assert srun_nodes(ranks, {"SLURM_NTASKS_PER_NODE": per_node}) == want


def test_gpu_scripts_set_the_gpu_environment():
    for script in JOBS.glob("train-gpu*.sbatch"):
        text = script.read_text()
        # One rank per GPU, the GPUs derived from the task count: one number to edit.
        assert sbatch_options(script).get("gpus-per-task") == "1", script.name
        assert "source jobs/lib/gpu-env.sh" in text and "--device cuda" in text, script.name
