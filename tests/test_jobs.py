"""The launch files users copy: Slurm batch scripts and the Kubernetes MPIJob."""

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


@pytest.mark.parametrize("script", sorted(JOBS.glob("*.sbatch")), ids=lambda p: p.name)
def test_batch_scripts_take_counts_from_slurm(script):
    text = script.read_text()
    options = sbatch_options(script)
    for key in ("job-name", "nodes", "ntasks-per-node", "time", "output"):
        assert key in options, f"{script.name}: #SBATCH --{key} missing"
    assert "source jobs/lib/launch.sh" in text
    assert not re.search(r"-np \d|-n \d|--ntasks=\d", text), "counts come from the allocation"
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_launch_library_defaults_to_srun_with_pmix():
    text = (JOBS / "lib" / "launch.sh").read_text()
    assert 'srun) srun --mpi=pmix "$@"' in text
    assert 'mpirun -np "$SLURM_NTASKS"' in text


def test_mpijob_structure():
    job = yaml.safe_load((JOBS / "k8s" / "mpijob-train.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    spec = job["spec"]
    slots = spec["slotsPerWorker"]
    launcher = spec["mpiReplicaSpecs"]["Launcher"]
    worker = spec["mpiReplicaSpecs"]["Worker"]
    assert launcher["replicas"] == 1
    command = launcher["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["mpirun", "-np", str(worker["replicas"] * slots)]
    for flag in (["-bind-to", "none"], ["-map-by", "slot"], ["-x", "LD_LIBRARY_PATH"],
                 ["-x", "PATH"], ["-mca", "pml", "ob1"], ["-mca", "btl", "^openib"]):
        assert any(command[i:i + len(flag)] == flag for i in range(len(command))), flag
    assert command[-5:] == ["-m", "hpctrain", "train", "--device", "cuda"]
    limits = worker["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == slots


def test_shellcheck_jobs_and_scripts():
    # scripts/setup installs shellcheck; without it this fails rather than skips.
    assert shutil.which("shellcheck"), "shellcheck missing: run scripts/setup"
    scripts = [p for p in (REPO / "scripts").iterdir()
               if p.read_text().startswith("#!/usr/bin/env bash")]
    files = [*JOBS.glob("*.sbatch"), *JOBS.glob("lib/*.sh"), *scripts]
    subprocess.run(["shellcheck", "-x", "-s", "bash", *map(str, files)], check=True, cwd=REPO)


@pytest.mark.parametrize("per_node, ranks, want", [
    ("4", 4, ["-N", "1"]), ("4", 5, ["-N", "2"]), ("4", 16, ["-N", "4"]),
    ("4(x3)", 8, ["-N", "2"]), ("", 8, []),
])
def test_study_srun_steps_take_the_fewest_nodes(per_node, ranks, want):
    from hpctrain.study.launcher import srun_nodes

    assert srun_nodes(ranks, {"SLURM_NTASKS_PER_NODE": per_node}) == want


def test_gpu_scripts_set_the_gpu_environment():
    for script in JOBS.glob("train-gpu*.sbatch"):
        text = script.read_text()
        assert "gpus-per-node" in sbatch_options(script), script.name
        assert "source jobs/lib/gpu-env.sh" in text and "--device cuda" in text, script.name
