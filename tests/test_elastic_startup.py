"""A rank lost while an elastic job starts: the start ends within seconds, never waits for
ever (issue 43). Until a start is up (every rank has started MPI and synced the state),
``MPI_Init`` has no failure detection, under ULFM too: the launcher watches the start's ranks
and ends a start that lost one, and each rank bounds its own waits in start-up
(:mod:`hpctrain.startup`). The jobs are tests/programs/elastic_start.py (hvd.init,
hvd.elastic.run, three steps), whose time is its start-up; each launch is bounded, so that a
hang fails the test."""

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO, run_bounded
from hpctrain import elastic_job as contract
from hpctrain import startup
from hpctrain.launch import launch_environment
from test_ft_stack import ft_launch

PROGRAM = REPO / "tests" / "programs" / "elastic_start.py"
TIMEOUT = 240           # s per job: two start-ups of torch at np 4 on 2 busy cores (30 s seen)
#: s from the SIGKILL to the end of the start it hit: the launcher's look (0.1 s), its grace
#: (3 s) and the end of mpirun and its ranks (1 s here), or Open MPI 4.1's own end of the job.
ENDED_WITHIN = 15
FIRED = re.compile(r"fault 'torch\.init' fires on rank (\d+): kill \(t=([\d.]+)\)")
START = re.compile(r"^\[hpctrain\.launch\] start \d+: np (\d+) on \S+ \(([^,]*),", re.M)


@pytest.mark.alone
@pytest.mark.parametrize("mode", ["in-place", "restart"])
def test_a_rank_lost_before_init_returns_ends_the_start_and_the_job_starts_again(
        request, tmp_path, mode):
    # Rank 1 dies in hvd.init before MPI starts, in the first start only: the others wait in
    # MPI_Init for it. In place (Open MPI 5, ULFM) mpirun would wait with them for ever, and
    # the launcher ends the start; on Open MPI 4.1 mpirun ends it. Either way the job starts
    # again, at np 4 (the same machine), counted as a restart.
    python = request.getfixturevalue("ft_python") if mode == "in-place" else Path(sys.executable)
    folder = tmp_path / "state"
    argv = [python, "-m", "hpctrain.launch", "--elastic", "--ft" if mode == "in-place" else
            "--no-ft", "-np", 4, "--min-np", 2, "--restart-delay", 0, "--state-dir", folder,
            python, PROGRAM]
    env = {**launch_environment(), "HPCTRAIN_FAULT": "torch.init@1#1/0:kill",
           "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}"}
    run = run_bounded([str(a) for a in argv], timeout=TIMEOUT, env=env)
    out = run.output
    assert run.returncode == 0, out
    assert START.findall(out) == [("4", "first start"), ("4", "restart 1 of 3")], out
    [(victim, fired)] = FIRED.findall(out)
    assert victim == "1", out
    # No rank got out of init in the first start: the kill came before init returned.
    assert re.findall(r"init returned in start (\d+)", out) == ["2"] * 4, out
    assert "done: 3 steps on 4 ranks, sum 12" in out, out
    events = contract.read_events(folder)
    [ended] = [e for e in events if e["event"] == "exit" and e["start"] == 1]
    took = ended["time"] - float(fired)
    print(f"{mode}: SIGKILL in start-up to the end of that start: {took:.2f} s")
    assert 0 < took < ENDED_WITHIN, out
    assert [e["start"] for e in events if e["event"] == contract.EVENT_UP] == [2], events
    if mode == "in-place":
        assert re.search(r"^\[hpctrain\.launch\] start 1: rank 1 \(pid \d+\) ended before the "
                         r"start was up", out, re.M), out
        assert "end 1: exit 1 after" in out and "(a rank lost while the start was not up: " \
            "ended by the launcher)" in out, out
        assert [e["ranks"] for e in events if e["event"] == "lost_in_start"] == [[1]], events


@pytest.mark.alone
def test_ranks_that_wait_too_long_in_start_up_end_saying_so(ft_python):
    # No launcher watches (as on a cluster, where a lost rank is on another machine): under
    # mpirun --with-ft ulfm the three others would wait in MPI_Init for ever; their bound
    # (2 s) ends each of them, with one line that names it and the setting.
    began = time.monotonic()
    run = ft_launch(ft_python, 4, PROGRAM, env={"HPCTRAIN_FAULT": "torch.init@1:kill",
                                                 startup.VARIABLE: "2"})
    out = run.output
    assert run.returncode != 0, out
    said = re.findall(r"^\[hpctrain\] rank (\d) of 4 on \S+ \(pid \d+\): waited 2 s for the "
                      r"other ranks in start-up \(in hvd\.init: MPI_Init and the world's "
                      r"set-up\): one of them has died or is stuck before it\. Ending this "
                      r"rank, whose job cannot start\. If the start is only slow, set "
                      r"HPCTRAIN_START_TIMEOUT_S to more seconds \(now "
                      r"HPCTRAIN_START_TIMEOUT_S=2\)\.$", out, re.M)
    assert sorted(said) == ["0", "2", "3"], out
    assert "init returned" not in out, out
    print(f"job ended {time.monotonic() - began:.1f} s after its launch")


@pytest.mark.alone
def test_a_start_whose_rank_dies_at_once_is_ended_though_it_never_comes_up(ft_python,
                                                                             tmp_path):
    # Rank 1 is gone within milliseconds of its start, likely before the launcher's first
    # look; the others would sleep 10 minutes and never say they are up.
    command = ["sh", "-c", 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then kill -9 $$; fi; sleep 600']
    argv = [ft_python, "-m", "hpctrain.launch", "--elastic", "--ft", "-np", 4,
            "--max-restarts", 0, "--state-dir", tmp_path / "state", *command]
    env = {**launch_environment(), "PATH": f"{ft_python.parent}{os.pathsep}{os.environ['PATH']}"}
    began = time.monotonic()
    run = run_bounded([str(a) for a in argv], timeout=TIMEOUT, env=env)
    took = time.monotonic() - began
    out = run.output
    assert run.returncode == 1, out
    assert re.search(r"start 1: rank 1 \((pid \d+|gone before it was seen)\) ended before the "
                     r"start was up", out), out
    assert "giving up: start 1 ended" in out, out
    print(f"launch to the launcher's exit: {took:.1f} s")
    assert took < 60, out


class FakeLaunch:
    """A stand-in for mpirun: a process whose children carry ``OMPI_COMM_WORLD_RANK`` (the
    ranks ``ranks``) and sleep, and one more child without it."""

    def __init__(self, ranks):
        self.children = [subprocess.Popen(["sleep", "60"], env={**os.environ, **extra})
                         for extra in [{"OMPI_COMM_WORLD_RANK": str(r)} for r in ranks] + [{}]]

    def end(self):
        for child in self.children:
            child.kill()
            child.wait()


def test_the_launcher_tells_a_lost_rank_from_one_never_seen(monkeypatch):
    from hpctrain.launch import elastic as launcher

    monkeypatch.setattr(launcher, "UNSEEN_S", 0.5)
    fake = FakeLaunch([0, 2, 3])        # rank 1 of 4 never appears
    try:
        ranks = launcher.LaunchRanks(os.getpid(), env=dict(os.environ), local=4)
        assert ranks.lost() == []
        assert sorted(rank for rank, _ in ranks.ranks.values()) == [0, 2, 3]
        fake.children[1].kill()         # rank 2
        fake.children[1].wait()
        assert ranks.lost() == [(2, fake.children[1].pid)]
        time.sleep(0.6)
        assert ranks.lost() == [(2, fake.children[1].pid), (1, None)]
        # Without local ranks (hosts given) a rank never seen may be on another machine.
        assert launcher.LaunchRanks(os.getpid(), env=dict(os.environ)).lost() == []
    finally:
        fake.end()


# --- the bound and the contract, without MPI ------------------------------------------------

WAITS = textwrap.dedent("""
    import sys, time
    from hpctrain import startup
    startup.begin(float(sys.argv[1]), 1, 4)
    print(startup._bound.watcher.pid, flush=True)
    for what, seconds in zip(sys.argv[2::2], sys.argv[3::2]):
        if what == "own":
            time.sleep(float(seconds))
            continue
        with startup.waiting(what):
            time.sleep(float(seconds))
    startup.end()
    print("up", flush=True)
""")


def waits(bound, *steps):
    """A process that bounds its start-up by ``bound`` s and then waits or works (``own``)
    for the seconds of ``steps``: ``(status, output, seconds)``."""
    began = time.monotonic()
    run = subprocess.run([sys.executable, "-c", WAITS, str(bound), *map(str, steps)],
                         capture_output=True, text=True, timeout=60, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    return run.returncode, run.stdout + run.stderr, time.monotonic() - began


def test_only_the_waits_count_against_the_bound():
    # 1 s of waits under a bound of 2 s, with 3 s of the rank's own work between them.
    status, out, _ = waits(2, "first", 0.5, "own", 3, "second", 0.5)
    assert status == 0 and out.endswith("up\n"), out


def test_a_rank_past_the_bound_is_ended_with_one_line_naming_the_wait():
    status, out, seconds = waits(1, "own", 0.5, "in a slow wait", 30)
    # An exit status (faulthandler's), not a signal: under ULFM mpirun exits 0 when every
    # rank was killed by a signal. The line first, then the traceback of where it waited.
    assert status == 1, out
    assert out.index("waited 1 s") < out.index("Timeout (0:00:02)!") < out.index("in <module>")
    assert re.search(r"^\[hpctrain\] rank 1 of 4 on \S+ \(pid \d+\): waited 1 s for the other "
                     r"ranks in start-up \(in a slow wait\): .* set HPCTRAIN_START_TIMEOUT_S "
                     r"to more seconds \(now HPCTRAIN_START_TIMEOUT_S=1\)\.$", out, re.M), out
    assert 1.5 <= seconds < 20, seconds


def test_the_watcher_ends_with_its_rank():
    status, out, _ = waits(60, "own", 0)
    watcher = int(out.split()[0])
    assert status == 0
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{watcher}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{watcher}")


def test_the_default_bound_grows_with_the_ranks_and_a_setting_wins():
    assert startup.timeout(None, 4) == startup.BASE_S + 4 * startup.PER_RANK_S
    assert startup.timeout(None, 16384) > startup.timeout(None, 4)
    assert startup.timeout(30.0, 16384) == 30.0
    assert startup.timeout(0.0, 4) == 0.0      # off


def test_a_start_is_up_once_rank_0_of_that_start_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv(contract.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(contract.ENV_RESTART, "1")       # the second start
    since = time.time()
    assert not contract.is_up(tmp_path, 2, since)
    contract.log_up(1, np=4)                            # only rank 0 logs
    assert not contract.is_up(tmp_path, 2, since)
    contract.log_up(0, np=4)
    assert contract.is_up(tmp_path, 2, since)
    assert not contract.is_up(tmp_path, 1, since)       # another start
    assert not contract.is_up(tmp_path, 2, time.time() + 1)     # another launcher's
