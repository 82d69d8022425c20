"""scripts/steps.sh, the steps of scripts/test: a failed or hung step is recorded, and an
interrupted scripts/test ends every step still running, in the foreground or beside.

Each step runs under ``timeout``, in a process group of its own, which a signal to the script
does not reach by itself: without the traps, a Ctrl-C or CI's TERM left the step (a whole
pytest run, a build) running after scripts/test had gone.
"""

import os
import signal
import subprocess
import time

import pytest

from conftest import REPO

DRIVER = """set -uo pipefail
results=$1
steps=$results/steps.tsv
failed=()
source {steps_sh}
{body}
echo "failed: ${{failed[*]}}"
"""


def driver(tmp_path, body):
    """A bash script that sources scripts/steps.sh and runs ``body``; its path."""
    script = tmp_path / "driver.sh"
    script.write_text(DRIVER.format(steps_sh=REPO / "scripts" / "steps.sh", body=body))
    return script


def recorded(tmp_path):
    """The lines of steps.tsv as (name, exit status)."""
    lines = (tmp_path / "steps.tsv").read_text().splitlines()
    return [(line.split("\t")[0], int(line.split("\t")[2])) for line in lines]


def test_a_failed_step_and_a_hung_one_are_recorded_and_named(tmp_path):
    script = driver(tmp_path, "run ok 10 true\nrun bad 10 false\nrun stuck 1 sleep 30\n")
    done = subprocess.run(["bash", str(script), str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert recorded(tmp_path) == [("ok", 0), ("bad", 1), ("stuck", 124)]
    assert "[test] HUNG: 'stuck' did not finish within 1 s" in done.stdout
    assert "failed: bad (exit 1) stuck (hung)" in done.stdout
    assert not list(tmp_path.glob(".running.*")), "a finished step left its PID file"


def alive(pid):
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupted_script_ends_the_steps_in_the_foreground_and_beside(tmp_path, sig,
                                                                           status):
    body = ("beside slow-beside 300 bash -c 'echo $$ > \"$0/beside.pid\"; exec sleep 300' "
            "\"$results\"\n"
            "run slow 300 bash -c 'echo $$ > \"$0/fg.pid\"; exec sleep 300' \"$results\"\n"
            "echo 'the step ran to its end'\n")
    script = driver(tmp_path, body)
    started = subprocess.Popen(["bash", str(script), str(tmp_path)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    pids = []
    try:
        for _ in range(300):          # the two steps write their PIDs within seconds
            if (tmp_path / "fg.pid").exists() and (tmp_path / "beside.pid").exists():
                break
            time.sleep(0.1)
        pids = [int((tmp_path / name).read_text()) for name in ("fg.pid", "beside.pid")]
        began = time.monotonic()
        started.send_signal(sig)      # to the script alone, as CI's TERM to its PID
        output, _ = started.communicate(timeout=30)
        assert started.returncode == status, output
        assert time.monotonic() - began < 15, "the script took its time to end"
        assert "ending every step still running" in output
        assert "the step ran to its end" not in output
        for _ in range(50):
            if not any(alive(pid) for pid in pids):
                break
            time.sleep(0.1)
        assert not [pid for pid in pids if alive(pid)], "a step outlived the script"
    finally:
        if started.poll() is None:
            started.kill()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
