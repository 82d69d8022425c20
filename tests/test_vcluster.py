"""Multi-node behaviour on the emulated cluster: hosts in network namespaces, rate-limited links.

The module fixture brings up 2 hosts with scripts/vcluster (its own namespace prefix and state
directory, so it never touches another cluster) and removes them afterwards.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VCLUSTER = REPO / "scripts" / "vcluster"
LAUNCH_TIMEOUT = 180  # s


@pytest.fixture(scope="module")
def vcluster(tmp_path_factory):
    """Environment that addresses a 2-host, 1 slot per host, 1 Gbit/s emulated cluster."""
    env = {**os.environ, "HPCTRAIN_VCLUSTER_DIR": str(tmp_path_factory.mktemp("vcluster")),
           "HPCTRAIN_VCLUSTER_PREFIX": f"hpt{os.getpid() % 100000}",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    up = subprocess.run([VCLUSTER, "up", "--hosts", "2", "--slots", "1", "--rate", "1gbit"],
                        env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield env
    finally:
        down = subprocess.run([VCLUSTER, "down"], env=env, capture_output=True, text=True,
                              timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert env["HPCTRAIN_VCLUSTER_PREFIX"] + "-" not in left, "down left namespaces behind"


def run_on_cluster(env, np, *command):
    command = [str(c) for c in command]
    try:
        return subprocess.run([VCLUSTER, "mpirun", "-np", str(np), *command], env=env,
                              capture_output=True, text=True, timeout=LAUNCH_TIMEOUT,
                              cwd=REPO, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"vcluster launch of {command} hung for {LAUNCH_TIMEOUT} s: {exc.output}")


def test_status_shows_each_host_with_its_link(vcluster):
    status = subprocess.run([VCLUSTER, "status"], env=vcluster, capture_output=True, text=True)
    prefix = vcluster["HPCTRAIN_VCLUSTER_PREFIX"]
    assert re.search(rf"{prefix}-h1\s+10\.77\.0\.1/24\s+qdisc tbf .*rate 1Gbit", status.stdout)
    assert re.search(rf"{prefix}-h2\s+10\.77\.0\.2/24\s+qdisc tbf .*rate 1Gbit", status.stdout)


def test_ranks_land_on_different_hosts(vcluster):
    result = run_on_cluster(vcluster, 2, sys.executable, "-m", "hpctrain", "info")
    assert result.returncode == 0, result.stdout + result.stderr
    hosts = re.findall(r"^\s+(\d)\s+(h\d)\s+\d+", result.stdout, re.M)
    assert hosts == [("0", "h1"), ("1", "h2")]


def test_two_host_allreduce_crosses_the_link(vcluster):
    result = run_on_cluster(vcluster, 2, sys.executable, "-m", "hpctrain", "bench",
                            "allreduce", "--algos", "ring,butterfly,mpi", "-b", "4K", "-e", "4M",
                            "-f", "4", "-n", "3", "-w", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "# Out of bounds values : 0 OK" in result.stdout
    # 4 MiB at 1 Gbit/s takes >= 2(p-1)/p * 4 MiB / 125 MB/s = 33 ms on the ring: the data
    # crossed the rate-limited link, not shared memory (which would take ~1 ms).
    row = re.search(r"^\s+4194304\s+\d+\s+float32\s+sum\s+ring\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)",
                    result.stdout, re.M)
    assert row and float(row.group(3)) > 25_000, result.stdout


def test_two_host_training_matches_one_host(vcluster, mpirun, tmp_path):
    """Training across the link gives the same run as on one host: the ring adds in the same
    order whatever carries the bytes, so losses agree to the last digit."""
    args = ["-m", "hpctrain", "train", "--epochs", "2", "--allreduce", "ring",
            "--progress", "never"]
    across = run_on_cluster(vcluster, 2, sys.executable, *args, "--run-dir", tmp_path / "2h")
    assert across.returncode == 0, across.stdout + across.stderr
    local = mpirun(2, [sys.executable, *args, "--run-dir", tmp_path / "1h"], timeout=180)
    assert local.returncode == 0, local.output
    assert re.search(r"^epoch\s+2/2 .*val_acc", across.stdout, re.M), across.stdout

    def losses(run):
        rows = (tmp_path / run / "metrics.csv").read_text().splitlines()
        columns = rows[0].split(",")
        keep = [columns.index(name) for name in ("epoch", "train_loss", "val_loss", "val_acc")]
        return [[row.split(",")[i] for i in keep] for row in rows[1:]]

    assert losses("2h") == losses("1h") and len(losses("2h")) == 2
