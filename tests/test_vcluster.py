"""Multi-node behaviour on the emulated cluster: hosts in network namespaces, rate-limited links.

The module fixture brings up 2 hosts with scripts/vcluster (its own namespace prefix and state
directory, so it never touches another cluster) and removes them afterwards. That takes root,
iproute2 and a kernel that lets us make network namespaces, bridges, veth pairs and tbf
qdiscs: where any is missing, every test here is skipped with a reason that names it. Ranks run
`python` as the README writes it, with no virtual environment on PATH: scripts/vcluster puts
the project's first. Every launch is bounded, and a hung one is killed with all it started.
"""

import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_bounded

#: Network namespaces and mpirun across them: these tests run alone (scripts/test).
pytestmark = pytest.mark.alone

VCLUSTER = REPO / "scripts" / "vcluster"
LAUNCH_TIMEOUT = 180  # s
SCRIPT_TIMEOUT = 120  # s, for up, down and status


def missing_for_vcluster():
    """Why scripts/vcluster cannot run here, or "" if it can: what ``up`` and ``mpirun`` do,
    tried once in a throw-away namespace."""
    if os.geteuid() != 0:
        return f"needs root to make network namespaces (euid {os.geteuid()})"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"needs {tool} ({package}), which is not on PATH"
    probe = f"hptprobe{os.getpid()}"
    steps = [["ip", "netns", "add", probe],
             ["ip", "-n", probe, "link", "add", "br0", "type", "bridge"],
             ["ip", "-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
             ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "v0", "root", "tbf",
              "rate", "1gbit", "burst", "256kb", "latency", "50ms"],
             ["ip", "netns", "exec", probe, "unshare", "--uts", "true"]]
    try:
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT)
            if done.returncode != 0:
                return f"`{' '.join(step)}` fails here: {done.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True,
                       timeout=SCRIPT_TIMEOUT)
    return ""


@contextlib.contextmanager
def emulated_cluster(tmp_path_factory, hosts, slots, prefix, venv=None):
    """Environment that addresses an emulated cluster of ``hosts`` x ``slots`` at 1 Gbit/s,
    with a namespace prefix and state folder of its own (``venv``: the stack whose mpirun it
    runs, default the one of this interpreter); taken down, and checked gone, at the end."""
    missing = missing_for_vcluster()
    if missing:
        pytest.skip(f"emulated cluster: {missing}")
    venv_bin = str(Path(sys.prefix) / "bin")
    path = ":".join(d for d in os.environ["PATH"].split(":") if d != venv_bin)
    env = {**os.environ, "HPCTRAIN_VCLUSTER_DIR": str(tmp_path_factory.mktemp(prefix)),
           "HPCTRAIN_VCLUSTER_PREFIX": f"{prefix}{os.getpid() % 100000}", "PATH": path}
    env.pop("VIRTUAL_ENV", None)
    if venv is not None:
        env["HPCTRAIN_VENV"] = str(venv)
    elif Path(sys.prefix) != REPO / ".venv":  # run from another environment: vcluster's choice
        env["HPCTRAIN_VENV"] = sys.prefix
    up = script(env, "up", "--hosts", str(hosts), "--slots", str(slots), "--rate", "1gbit")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield env
    finally:
        down = script(env, "down")
        assert down.returncode == 0, down.stdout + down.stderr
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                              timeout=SCRIPT_TIMEOUT).stdout
        assert env["HPCTRAIN_VCLUSTER_PREFIX"] + "-" not in left, "down left namespaces behind"


@pytest.fixture(scope="module")
def vcluster(tmp_path_factory):
    """Environment that addresses a 2-host, 1 slot per host, 1 Gbit/s emulated cluster."""
    with emulated_cluster(tmp_path_factory, 2, 1, "hpt") as env:
        yield env


def script(env, *args):
    """``scripts/vcluster ARGS`` (up, down, status: no process outlives them)."""
    return subprocess.run([VCLUSTER, *args], env=env, capture_output=True, text=True,
                          timeout=SCRIPT_TIMEOUT)


def run_on_cluster(env, np, *command):
    """``scripts/vcluster mpirun -np NP COMMAND`` -> ``Launch``. A hang fails the test after
    LAUNCH_TIMEOUT, and kills the launch's ranks on every emulated host, not mpirun alone."""
    return run_bounded([VCLUSTER, "mpirun", "-np", np, *command], timeout=LAUNCH_TIMEOUT,
                       env=env)


def test_status_shows_each_host_with_its_link(vcluster):
    status = script(vcluster, "status")
    prefix = vcluster["HPCTRAIN_VCLUSTER_PREFIX"]
    assert re.search(rf"{prefix}-h1\s+10\.77\.0\.1/24\s+qdisc tbf .*rate 1Gbit", status.stdout)
    assert re.search(rf"{prefix}-h2\s+10\.77\.0\.2/24\s+qdisc tbf .*rate 1Gbit", status.stdout)


def test_links_carry_jumbo_frames_and_a_bad_mtu_is_refused(vcluster):
    prefix = vcluster["HPCTRAIN_VCLUSTER_PREFIX"]
    assert "mtu=9000" in script(vcluster, "status").stdout
    link = subprocess.run(["ip", "-n", f"{prefix}-h1", "link", "show", "vc0"],
                          capture_output=True, text=True, timeout=SCRIPT_TIMEOUT).stdout
    assert " mtu 9000 " in link, link
    other = {**vcluster, "HPCTRAIN_VCLUSTER_PREFIX": prefix + "x"}
    bad = script(other, "up", "--hosts", "2", "--mtu", "100")
    assert bad.returncode != 0 and "--mtu must be a number of bytes from 576 to 65535" \
        in bad.stderr, bad.stdout + bad.stderr


def test_ranks_run_the_projects_python_without_an_activated_venv(vcluster):
    # One write(2) per rank: print() may hand its words to the pipe one by one, and mpirun
    # interleaves the two ranks' pieces ("prefixprefix /a\n /a").
    probe = "import os, sys; os.write(1, f'<prefix {sys.prefix}>\\n'.encode())"
    result = run_on_cluster(vcluster, 2, "python", "-c", probe)
    assert result.returncode == 0, result.output
    assert re.findall(r"<prefix (\S+)>", result.output) == [sys.prefix] * 2, result.output


def test_ranks_land_on_different_hosts(vcluster):
    result = run_on_cluster(vcluster, 2, "python", "-m", "hpctrain", "info")
    assert result.returncode == 0, result.output
    hosts = re.findall(r"^\s+(\d)\s+(h\d)\s+\d+", result.output, re.M)
    assert hosts == [("0", "h1"), ("1", "h2")]


def test_two_host_allreduce_crosses_the_link(vcluster):
    result = run_on_cluster(vcluster, 2, "python", "-m", "hpctrain", "bench",
                            "allreduce", "--algos", "ring,butterfly,mpi", "-b", "4K", "-e", "4M",
                            "-f", "4", "-n", "3", "-w", "1")
    assert result.returncode == 0, result.output
    assert "# Out of bounds values : 0 OK" in result.output
    # 4 MiB at 1 Gbit/s takes >= 2(p-1)/p * 4 MiB / 125 MB/s = 33 ms on the ring: the data
    # crossed the rate-limited link, not shared memory (which would take ~1 ms).
    row = re.search(r"^\s+4194304\s+\d+\s+float32\s+sum\s+ring\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)",
                    result.output, re.M)
    assert row and float(row.group(3)) > 25_000, result.output


#: Prints what the ring chose for its messages on this launch, and whether the sum was right.
RING_SEGMENTS = """
import os
import numpy as np
from hpctrain.collectives import allreduce, context
data = np.arange(100_000, dtype=np.float64)
allreduce(data, algo="ring")
right = bool(np.array_equal(data, 2 * np.arange(100_000)))
chosen = [v for (name, _), v in context().setups.items() if name == "ring"]
os.write(1, f"<ring segment {chosen} right {right}>\\n".encode())
"""


def test_the_ring_of_two_hosts_sends_segments_and_of_one_host_whole_messages(vcluster, mpirun):
    # Over TCP two ranks' whole messages take turns on their one connection; in shared memory
    # they do not, and segments would only cost calls (docs/collectives.md, ring).
    across = run_on_cluster(vcluster, 2, "python", "-c", RING_SEGMENTS)
    assert across.returncode == 0, across.output
    assert re.findall(r"<ring segment (.*?)>", across.output) == ["[32768] right True"] * 2, \
        across.output
    local = mpirun(2, [sys.executable, "-c", RING_SEGMENTS], timeout=120)
    assert local.returncode == 0, local.output
    assert re.findall(r"<ring segment (.*?)>", local.output) == ["[0] right True"] * 2, \
        local.output
    # The launch line's choice, as on an RDMA network: whole messages across the hosts too.
    whole = run_on_cluster({**vcluster, "HPCTRAIN_SEGMENT_BYTES": "0"}, 2,
                           "-x", "HPCTRAIN_SEGMENT_BYTES", "python", "-c", RING_SEGMENTS)
    assert whole.returncode == 0, whole.output
    assert re.findall(r"<ring segment (.*?)>", whole.output) == ["[0] right True"] * 2, \
        whole.output


def test_two_host_training_matches_one_host(vcluster, mpirun, tmp_path):
    """Training across the link gives the same run as on one host: the ring adds in the same
    order whatever carries the bytes, so losses agree to the last digit."""
    args = ["-m", "hpctrain", "train", "--epochs", "2", "--allreduce", "ring",
            "--progress", "never"]
    across = run_on_cluster(vcluster, 2, "python", *args, "--run-dir", tmp_path / "2h")
    assert across.returncode == 0, across.output
    local = mpirun(2, [sys.executable, *args, "--run-dir", tmp_path / "1h"], timeout=180)
    assert local.returncode == 0, local.output
    assert re.search(r"^epoch\s+2/2 .*val_acc", across.output, re.M), across.output

    def losses(run):
        rows = (tmp_path / run / "metrics.csv").read_text().splitlines()
        columns = rows[0].split(",")
        keep = [columns.index(name) for name in ("epoch", "train_loss", "val_loss", "val_acc")]
        return [[row.split(",")[i] for i in keep] for row in rows[1:]]

    assert losses("2h") == losses("1h") and len(losses("2h")) == 2
