"""The batch scripts in jobs/ on a real Slurm of two nodes: one slurmd on each host of the
emulated cluster (scripts/vcluster: a network namespace, address and hostname per host, linked
at 1 Gbit/s), slurmctld on h1, started by ``scripts/slurm-local up --vcluster``.

It needs what scripts/slurm-local and scripts/vcluster need (root, Slurm's packages or
apt-get to install them, network namespaces): where any is missing, every test here is skipped
with a reason that names it. The module fixture uses a namespace prefix and state directories
of its own, so it never touches another cluster, and takes everything down afterwards, failed
or not. Jobs are submitted from h1, where slurmctld is reached
(``scripts/slurm-local exec --vcluster sbatch ...``), each waited for with a time limit. The
nodes share this machine's 2 cores: 2 tasks per node fit the CPUs each node declares. About
80 s in all (2 cores).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO, assert_root_cause
from test_slurm import SCRIPT_TIMEOUT, SLURM_LOCAL, missing_for_slurm, submit
from test_vcluster import missing_for_vcluster

#: A Slurm of two emulated nodes (network namespaces): these tests run alone (scripts/test).
pytestmark = pytest.mark.alone

VIA = [str(SLURM_LOCAL), "exec", "--vcluster"]
TWO_BY_TWO = ("--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=1")


@pytest.fixture(scope="module")
def cluster():
    """Environment for ``submit(..., via=VIA)`` against Slurm on emulated hosts h1 and h2."""
    missing = missing_for_slurm() or missing_for_vcluster()
    if missing:
        pytest.skip(f"two-node Slurm: {missing}")
    # A short path: slurmd's and PMIx's Unix sockets live under it, at most 108 bytes each.
    state = Path(tempfile.mkdtemp(prefix="hpts"))
    env = {**os.environ, "HPCTRAIN_SLURM_DIR": str(state / "slurm"),
           "HPCTRAIN_VCLUSTER_DIR": str(state / "vcluster"),
           "HPCTRAIN_VCLUSTER_PREFIX": f"hps{os.getpid() % 100000}",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    if Path(sys.prefix) != REPO / ".venv":  # run from another environment: the jobs use it
        env["HPCTRAIN_VENV"] = sys.prefix
    daemons = []
    try:
        up = subprocess.run([SLURM_LOCAL, "up", "--vcluster", "--nodes", "2"], env=env,
                            capture_output=True, text=True, timeout=600)
        assert up.returncode == 0, f"slurm-local up --vcluster failed:\n{up.stdout}{up.stderr}"
        status = subprocess.run([SLURM_LOCAL, "status"], env=env, capture_output=True,
                                text=True, timeout=SCRIPT_TIMEOUT).stdout
        daemons = [int(pid) for pid in re.findall(r"running \(pid (\d+)\)", status)]
        assert len(daemons) == 4, status  # munged, slurmctld, a slurmd on h1 and on h2
        yield env
    finally:
        down = subprocess.run([SLURM_LOCAL, "down"], env=env, capture_output=True, text=True,
                              timeout=SCRIPT_TIMEOUT)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                              timeout=SCRIPT_TIMEOUT).stdout
        shutil.rmtree(state, ignore_errors=True)
        assert down.returncode == 0, down.stdout + down.stderr
        assert env["HPCTRAIN_VCLUSTER_PREFIX"] + "-" not in left, "down left namespaces behind"
        alive = [pid for pid in daemons if running(pid)]
        assert not alive, f"down left daemons running: {alive}"


def running(pid):
    """True while process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def run_job(env, tmp_path, script, *options, args=(), extra_env=None):
    """The job submitted on the two nodes and waited for -> (exit code, output, seconds)."""
    start = time.monotonic()
    code, output = submit(env, script, tmp_path, *options, args=args, extra_env=extra_env,
                          via=VIA)
    return code, output, time.monotonic() - start


def vc0_bytes(env, host):
    """(sent, received) bytes so far on emulated host ``host``'s link."""
    ns = f"{env['HPCTRAIN_VCLUSTER_PREFIX']}-h{host}"
    shown = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", "vc0"],
                           capture_output=True, text=True, timeout=SCRIPT_TIMEOUT, check=True)
    stats = json.loads(shown.stdout)[0]["stats64"]
    return stats["tx"]["bytes"], stats["rx"]["bytes"]


#: A user's script: where each rank runs, the algorithm it was given, and allreduces whose
#: sums are exact.
WHERE = """
import os
import socket

import torch

import hpctrain.torch as hvd

hvd.init()
ranks = hvd.allreduce(torch.tensor(float(hvd.rank())), op=hvd.Sum, name="ranks")
big = hvd.allreduce(torch.ones(1 << 20), op=hvd.Sum, name="4 MiB")
os.write(1, f"<rank {hvd.rank()} of {hvd.size()} local {hvd.local_rank()} on "
            f"{socket.gethostname()} algo {os.environ.get('HPCTRAIN_ALLREDUCE')} "
            f"sum {ranks.item():g} {big.min().item():g}>\\n".encode())
"""

#: A plain mpi4py program in which rank 3 (on h2) raises while the others wait for it.
RAISES = """
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
comm.barrier()
if comm.rank == 3:
    raise RuntimeError("a bug on rank 3")
comm.bcast(None, root=3)
print(f"rank {comm.rank} was not stopped", flush=True)
"""


#: Open MPI refuses root without these; on a cluster jobs do not run as root.
MPIRUN_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_users_script_runs_on_both_nodes_and_reduces_across_the_link(cluster, tmp_path,
                                                                      launcher):
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    sent, received = vc0_bytes(cluster, 2)
    code, output, _ = run_job(cluster, tmp_path, "jobs/run.sbatch", *TWO_BY_TWO,
                              args=[str(script)],
                              extra_env={"HPCTRAIN_LAUNCHER": launcher,
                                         "HPCTRAIN_ALLREDUCE": "tree", **MPIRUN_AS_ROOT})
    assert code == 0, output
    ranks = sorted(re.findall(r"<rank (\d) of 4 local (\d) on (h\d) algo tree sum 6 4>",
                              output))
    # Consecutive ranks per node, and local ranks 0 and 1 on each: what
    # torch.cuda.set_device(hvd.local_rank()) needs on GPU nodes.
    assert ranks == [("0", "0", "h1"), ("1", "1", "h1"), ("2", "0", "h2"), ("3", "1", "h2")], \
        output
    # Each host must learn the other's 4 MiB: at least that much crossed h2's link each way,
    # over TCP on vc0, not through shared memory.
    after = vc0_bytes(cluster, 2)
    assert after[0] - sent > 4 << 20 and after[1] - received > 4 << 20, (sent, received, after)


def test_horovod_style_example_trains_on_two_nodes(cluster, tmp_path):
    code, output, _ = run_job(cluster, tmp_path, "jobs/run.sbatch", *TWO_BY_TWO,
                              args=["examples/horovod_style.py", "--epochs", "2"])
    assert code == 0, output
    assert "# job " in output and ": 4 tasks on 2 node(s): h[1-2]" in output
    # Rank 0 prints the test accuracy averaged over all ranks (the script's metric_average).
    accuracy = re.findall(r"^epoch 2: loss [\d.]+ +test accuracy ([\d.]+)%", output, re.M)
    assert accuracy and float(accuracy[0]) > 80, output
    assert "ranks 4, replicas identical: True" in output


def test_fsdp2_example_over_the_hpctrain_backend_trains_on_two_nodes(cluster, tmp_path):
    # torch.distributed's own API, no MASTER_ADDR: FSDP2's all-gathers and reduce-scatters
    # go over MPI between the hosts.
    sent, received = vc0_bytes(cluster, 2)
    code, output, _ = run_job(cluster, tmp_path, "jobs/run.sbatch", *TWO_BY_TWO,
                              args=["examples/fsdp_mpi.py", "--epochs", "2"])
    assert code == 0, output
    assert "# job " in output and ": 4 tasks on 2 node(s): h[1-2]" in output
    accuracy = re.findall(r"^epoch 2: loss [\d.]+ +test accuracy ([\d.]+)%", output, re.M)
    assert accuracy and float(accuracy[0]) > 80, output
    assert re.search(r"^ranks 4, backend hpctrain, .* parameters held by rank 0: \d+ of 9610",
                     output, re.M), output
    after = vc0_bytes(cluster, 2)
    assert after[0] - sent > 256 << 10 and after[1] - received > 256 << 10, \
        (sent, received, after)

def test_a_rank_that_raises_on_the_second_node_ends_the_job(cluster, tmp_path):
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    code, output, seconds = run_job(cluster, tmp_path, "jobs/run.sbatch", *TWO_BY_TWO,
                                    args=[str(script)])
    assert code != 0, output
    assert "RuntimeError: a bug on rank 3" in output and "was not stopped" not in output, output
    assert seconds < 60, f"the job took {seconds:.0f} s to end:\n{output}"


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_a_rank_that_raises_is_named_in_one_block_at_the_end_of_the_job(cluster, tmp_path,
                                                                          launcher):
    # Ranks 0 and 1 on h1, 2 and 3 on h2: rank 1 raises while the others wait for it.
    code, output, _ = run_job(cluster, tmp_path, "jobs/run.sbatch", *TWO_BY_TWO,
                              args=["tests/programs/fail_on_rank.py", "1"],
                              extra_env={"HPCTRAIN_LAUNCHER": launcher, **MPIRUN_AS_ROOT})
    assert code != 0, output
    assert_root_cause(output, rank=1, size=4, host="h1",
                      error="RuntimeError: rank 1 fails on purpose")


@pytest.mark.parametrize("args, error", [
    ([], "error: no script given"),
    (["no_such_script.py"], "error: no script 'no_such_script.py' in"),
], ids=["no-script", "missing-script"])
def test_bad_input_ends_the_job_before_any_rank_starts(cluster, tmp_path, args, error):
    code, output, _ = run_job(cluster, tmp_path, "jobs/run.sbatch", *TWO_BY_TWO, args=args)
    assert code != 0, output
    # The job's header, the one error, and nothing from srun or a rank.
    lines = output.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("# job ") and lines[1].startswith(error), \
        output


def test_multinode_training_job_reaches_its_accuracy_line(cluster, tmp_path):
    code, output, _ = run_job(cluster, tmp_path, "jobs/train-cpu-multinode.sbatch",
                              "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1",
                              extra_env={"HPCTRAIN_ARGS": f"--epochs 2 --run-dir {tmp_path}/run"})
    assert code == 0, output
    assert ": 2 tasks on 2 node(s): h[1-2]" in output
    accuracy = re.findall(r"^epoch\s+2/2 .* val_acc\s+([\d.]+)%", output, re.M)
    assert accuracy and float(accuracy[0]) > 80, output
    assert (tmp_path / "run" / "metrics.csv").exists()


def test_study_job_fits_the_link_between_the_nodes(cluster, tmp_path):
    report = tmp_path / "report"
    code, output, _ = run_job(cluster, tmp_path, "jobs/study.sbatch", *TWO_BY_TWO,
                              "--time=00:10:00",
                              extra_env={"HPCTRAIN_ARGS": f"--quick --algos ring "
                                                          f"--out {report}"})
    assert code == 0, output
    assert "# study at 2,4 ranks (2 per node)" in output
    params = json.loads((report / "params.json").read_text())
    # Two levels: α, β inside a node (p = 2, one node), α', β' between (p = 4, two nodes);
    # the 4-rank points, more ranks than the batch node's cores, are in the fit.
    assert params["ranks_per_node"] == 2 and params["fit_ranks"] == [2, 4], params
    fitted = params["fitted"]
    assert {"alpha", "beta", "alpha_inter", "beta_inter"} <= set(fitted), params
    # The 1 Gbit/s link (8 ns/B) is slower than memory inside a node.
    assert fitted["beta_inter"] > fitted["beta"], params
    assert "α', β': between nodes" in (report / "summary.md").read_text()
