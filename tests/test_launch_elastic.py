"""``python -m hpctrain.launch --elastic``: restarts after lost ranks, shrinking and growing
hosts, the ends it gives a job, bad input, signals. The ranks are a stand-in that keeps the
contract of hpctrain/elastic_job.py (tests/programs/elastic_counter.py): each start counts one
sample per rank and step, so the samples of a finished job say exactly which starts ran
which steps on how many ranks. Two jobs have real ranks: a Horovod elastic script
(examples/elastic_style.py) restarted from its commit, and, on the fault-tolerant stack
(scripts/setup --ft), ranks that survive a lost one in place, without a restart."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, note_launch, run_bounded
from hpctrain import elastic_job as contract
from hpctrain import launch as launching
from hpctrain.errors import UsageError
from hpctrain.launch import elastic as launcher
from hpctrain.launch import hosts as hostlists
from hpctrain.launch import launch_environment
from hpctrain.launch.__main__ import main as launch_main
from hpctrain.mpi import ulfm as mpi_ulfm
from hpctrain.mpi.ulfm import FaultTolerance

LAUNCHER = [sys.executable, "-m", "hpctrain.launch", "--elastic"]
COUNTER = [sys.executable, str(REPO / "tests" / "programs" / "elastic_counter.py")]
TIMEOUT = 90           # s per elastic job: each start takes a few seconds here
RESTART_WITHIN = 30    # s from a failed mpirun's exit to the next start's ranks, at most
START = re.compile(r"^\[hpctrain\.launch\] start (\d+): np (\d+) on (\S+) \((.*)\)$", re.M)
END = re.compile(r"^\[hpctrain\.launch\] end (\d+): exit (-?\d+) after [\d.]+ s \((.*)\)$",
                 re.M)


def elastic(*args, timeout=TIMEOUT):
    """Run the elastic launcher with ``args`` (stdout and stderr together), bounded."""
    return run_bounded([*LAUNCHER, *map(str, args)], timeout=timeout, env=launch_environment())


def starts(output):
    """``[(np, hosts, why), ...]``, one per start the launcher reported, in order."""
    found = START.findall(output)
    assert [int(n) for n, *_ in found] == list(range(1, len(found) + 1)), output
    return [(int(np), hosts, why) for _, np, hosts, why in found]


def restart_costs(folder):
    """Seconds from each failed mpirun's exit to the first line of the next start's ranks
    (rank 0's ``rank_start``), from the job's events."""
    events = contract.read_events(folder)
    costs = []
    for i, event in enumerate(events):
        if event["event"] == "exit" and event["rc"] != 0:
            ready = [e for e in events[i + 1:] if e["event"] == "rank_start"]
            if ready:
                costs.append(ready[0]["time"] - event["time"])
    return costs


@dataclass
class Discovery:
    """A discovery script that prints ``hosts`` (a file the test and the ranks write)."""

    script: Path
    hosts: Path

    def set(self, text):
        self.hosts.write_text(text.replace(";", "\n") + "\n")


@pytest.fixture
def discovery(tmp_path):
    """A :class:`Discovery` in ``tmp_path``."""
    found = Discovery(tmp_path / "discover.sh", tmp_path / "hosts.txt")
    found.script.write_text(f"#!/bin/sh\nexec cat {found.hosts}\n")
    found.script.chmod(0o755)
    return found


# --- restarts after lost ranks --------------------------------------------------------------

@pytest.mark.alone
def test_a_killed_rank_is_restarted_from_the_last_commit(tmp_path):
    folder = tmp_path / "state"
    run = elastic("-np", 2, "--state-dir", folder, *COUNTER, "--steps", 6, "--fault", "0,1,3")
    assert run.returncode == 0, run.output
    (np1, _, why1), (np2, hosts2, why2) = starts(run.output)
    assert (np1, np2, hosts2) == (2, 2, "localhost:2"), run.output
    assert why1 == "first start, no commit in the state folder yet", run.output
    assert why2 == f"restart 1 of 3, from the commit in {folder}", run.output
    assert END.findall(run.output)[0][1:] == ("137", "a rank ended by SIGKILL"), run.output
    # Steps 0-2 on the first start, 3-5 on the second: every step once, on 2 ranks.
    assert "rank 0 of 2: start 1 at step 3" in run.output, run.output
    assert "finished: step 6, samples 12" in run.output, run.output
    [cost] = restart_costs(folder)
    print(f"restart cost: {cost:.2f} s (mpirun's exit to the next start's first line)")
    assert 0 < cost < RESTART_WITHIN, cost


@pytest.mark.alone
@pytest.mark.parametrize("min_np", [2, 3])
def test_lost_hosts_shrink_the_job_until_too_few_are_left(discovery, tmp_path, min_np):
    # Each fault takes a slot out of the discovery script's answer, then kills its rank:
    # 4 ranks -> 3 -> 2, which --min-np 3 does not accept.
    discovery.set("localhost:4")
    folder = tmp_path / "state"
    run = elastic("--min-np", min_np, "--host-discovery-script", discovery.script,
                  "--restart-delay", 0.2, "--state-dir", folder, *COUNTER, "--steps", 6,
                  "--hosts-file", discovery.hosts,
                  "--fault", "0,3,2,localhost:3", "--fault", "1,2,4,localhost:2")
    nps = [np for np, _, _ in starts(run.output)]
    if min_np == 2:
        assert run.returncode == 0, run.output
        assert nps == [4, 3, 2], run.output
        assert "finished: step 6, samples 18" in run.output, run.output   # 4*2 + 3*2 + 2*2
        assert len(restart_costs(folder)) == 2
    else:
        assert run.returncode == contract.EXIT_TOO_FEW, run.output
        assert nps == [4, 3], run.output
        assert run.output.count("fewer than --min-np 3 ranks left") == 1, run.output
        assert "2 slot(s) on localhost:2 after start 2 failed" in run.output, run.output
    assert contract.read_hosts(folder) == (len(nps), [("localhost", nps[-1])])


@pytest.mark.alone
def test_added_slots_relaunch_the_job_on_more_ranks(discovery, tmp_path):
    # Rank 0 adds slots at step 2 (4 of them; --max-np 3 takes 3) and waits at its commit
    # for the launcher to publish them; every rank then exits 75 at that commit.
    discovery.set("localhost:2")
    folder = tmp_path / "state"
    run = elastic("--max-np", 3, "--host-discovery-script", discovery.script,
                  "--discovery-interval", 0.2, "--state-dir", folder, *COUNTER, "--steps", 6,
                  "--hosts-file", discovery.hosts, "--grow", "0,2,localhost:4")
    assert run.returncode == 0, run.output
    assert starts(run.output) == [
        (2, "localhost:2", "first start, no commit in the state folder yet"),
        (3, "localhost:3", f"hosts added, from the commit in {folder}")], run.output
    assert "more hosts: localhost:3 (np 2 -> 3); published as hosts.json version 2" \
        in run.output, run.output
    assert END.findall(run.output)[0][1:] == ("75", "hosts updated"), run.output
    assert "finished: step 6, samples 15" in run.output, run.output   # 2*3 + 3*3
    assert "restart" not in " ".join(why for *_, why in starts(run.output))
    assert contract.read_hosts(folder) == (2, [("localhost", 3)])


@pytest.mark.alone
def test_the_job_ends_when_the_restarts_are_used(tmp_path):
    run = elastic("-np", 2, "--max-restarts", 1, "--restart-delay", 0.1, "--state-dir",
                  tmp_path / "state", *COUNTER, "--steps", 6, "--fault", "0,1,1",
                  "--fault", "1,1,2")
    assert run.returncode == 1, run.output
    assert [why.split(",")[0] for *_, why in starts(run.output)] == \
        ["first start", "restart 1 of 1"], run.output
    message = ("giving up: start 2 ended with exit 137 (a rank ended by SIGKILL) and the "
               "restarts are used (--max-restarts 1)")
    assert run.output.count(message) == 1, run.output


@pytest.mark.alone
def test_np_beside_hosts_caps_the_first_start(discovery, tmp_path):
    # As Horovod's -np: 2 of the 3 slots at first; they are no new hosts, so no relaunch.
    discovery.set("localhost:3")
    run = elastic("-np", 2, "--host-discovery-script", discovery.script,
                  "--discovery-interval", 0.1, "--state-dir", tmp_path / "state",
                  "sh", "-c", "sleep 1")
    assert run.returncode == 0, run.output
    assert [(np, hosts) for np, hosts, _ in starts(run.output)] == [(2, "localhost:2")]
    assert "more hosts" not in run.output, run.output


@pytest.mark.alone
@pytest.mark.parametrize("status, rc, message", [
    (0, 0, "job finished after 1 start(s), 0 restart(s)"),
    (76, 76, "fewer than --min-np 1 ranks left: the ranks ended the job (exit 76)"),
    (75, 1, "the ranks ended with 75 (hosts updated), but no new hosts were published"),
], ids=["exit0", "exit76", "exit75-unasked"])
def test_what_the_ranks_exit_with_decides_the_next_start(tmp_path, status, rc, message):
    run = elastic("-np", 2, "--max-restarts", 0, "--state-dir", tmp_path / "state",
                  "sh", "-c", f"exit {status}")
    assert run.returncode == rc, run.output
    assert len(starts(run.output)) == 1, run.output
    assert run.output.count(message) == 1, run.output


@pytest.mark.alone
@pytest.mark.parametrize("answer", ["exit 1", "echo 'not a host list'"])
def test_a_discovery_script_failing_during_the_run_keeps_the_hosts(tmp_path, answer):
    # It answers the first start, then fails at every look for more hosts (every 0.1 s).
    script, calls = tmp_path / "discover.sh", tmp_path / "calls"
    script.write_text(f"#!/bin/sh\n[ -e {calls} ] && {answer}\ntouch {calls}\n"
                      "echo localhost:2\n")
    script.chmod(0o755)
    run = elastic("--host-discovery-script", script, "--discovery-interval", 0.1,
                  "--state-dir", tmp_path / "state", *COUNTER, "--steps", 20,
                  "--step-seconds", 0.1)
    assert run.returncode == 0, run.output
    assert run.output.count("warning: --host-discovery-script") == 1, run.output
    assert "keeping the hosts localhost:2" in run.output, run.output
    assert len(starts(run.output)) == 1, run.output


@pytest.mark.alone
@pytest.mark.slow   # torch in every rank of two starts: 15-40 s here
def test_a_horovod_elastic_script_resumes_from_its_commit_after_a_restart(tmp_path):
    # The ranks' side for real (hvd.elastic.run, TorchState, ElasticSampler): rank 1 dies at
    # its 10th step of the first start; the restart resumes from the commit (every 5 steps).
    folder, log = tmp_path / "state", tmp_path / "steps.jsonl"
    argv = [*LAUNCHER, "--no-ft", "-np", 2, "--state-dir", folder, sys.executable,
            REPO / "examples" / "elastic_style.py", "--epochs", 1, "--commit-every", 5,
            "--log", log]
    run = run_bounded([str(a) for a in argv], timeout=TIMEOUT,
                      env={**launch_environment(), "HPCTRAIN_FAULT": "torch.step@1#10/0:kill"})
    assert run.returncode == 0, run.output
    assert [why.split(",")[0] for *_, why in starts(run.output)] == \
        ["first start", "restart 1 of 3"], run.output
    assert run.output.count("[hpctrain.elastic] resuming from the commit in") == 1, run.output
    assert re.search(r"^done: \d+ steps on 2 ranks", run.output, re.M), run.output
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # The restart is the longest pause between two logged steps (steps take milliseconds, a
    # restart seconds). The step after it may repeat some (those since the commit) or none:
    # rank 1 dies inside its 10th step, and rank 0 can still finish that step and commit it.
    again = max(range(1, len(records)),
                key=lambda i: records[i]["time"] - records[i - 1]["time"])
    lost = records[again - 1]["step"] - (records[again]["step"] - 1)
    assert 0 <= lost < 5, records     # the steps since the last commit, no more
    down = records[again]["time"] - records[again - 1]["time"]
    print(f"restart with torch: {down:.1f} s from the last step before the failure to the "
          f"first after it, {lost} step(s) done again")
    assert down < 2 * RESTART_WITHIN, down


SURVIVE_IN_PLACE = textwrap.dedent("""
    import os, signal, sys
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    if world.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)    # before any collective: none is left half-done
    try:
        world.Barrier()                          # fails on every survivor: rank 1 never comes
        sys.exit("the barrier without rank 1 succeeded")
    except MPI.Exception:
        pass
    survivors = world.Shrink()
    total = survivors.allreduce(world.rank)
    if survivors.rank == 0:
        print(f"survivors {survivors.size}, sum of their old ranks {total}", flush=True)
""")


def test_on_a_fault_tolerant_mpi_the_survivors_go_on_without_a_restart(ft_python, tmp_path):
    # The stack of scripts/setup --ft (Open MPI 5, mpi4py with ULFM): the launcher finds it
    # and adds --with-ft ulfm; a SIGKILLed rank is then survived in place, in one start.
    program = tmp_path / "survive.py"
    program.write_text(SURVIVE_IN_PLACE)
    argv = [ft_python, "-m", "hpctrain.launch", "--elastic", "-np", 3, "--state-dir",
            tmp_path / "state", ft_python, program]
    env = {**launch_environment(), "PATH": f"{ft_python.parent}{os.pathsep}{os.environ['PATH']}"}
    run = run_bounded([str(a) for a in argv], timeout=TIMEOUT, env=env)
    assert run.returncode == 0, run.output
    assert "lost ranks: the survivors go on in place (mpirun --with-ft ulfm" in run.output
    [launch] = [e for e in contract.read_events(tmp_path / "state") if e["event"] == "launch"]
    assert "--with-ft ulfm --mca async_mpi_finalize 1" in " ".join(launch["argv"])
    assert len(starts(run.output)) == 1, run.output
    assert "survivors 2, sum of their old ranks 2" in run.output, run.output


# --- the state folder ----------------------------------------------------------------------

@pytest.mark.alone
def test_a_new_state_folder_by_default_and_a_given_one_resumed(tmp_path):
    def job(*args, steps):
        note_launch()
        argv = [*LAUNCHER, "-np", 2, *args, *COUNTER, "--steps", steps]
        return launching.run_bounded([str(a) for a in argv], TIMEOUT, cwd=tmp_path,
                                     env=launch_environment())

    first = job(steps=3)
    assert first.returncode == 0, first.stdout
    folders = re.findall(r"^\[hpctrain\.launch\] state folder (\S+)$", first.stdout, re.M)
    assert len(folders) == 1 and re.fullmatch(r"runs/elastic/\d{8}-\d{6}-\d+", folders[0]), \
        first.stdout
    folder = tmp_path / folders[0]
    assert "finished: step 3, samples 6" in first.stdout, first.stdout
    again = job("--state-dir", folder, steps=5)
    assert again.returncode == 0, again.stdout
    assert f"state folder {folder}: resuming from its commit (state.pt)" in again.stdout
    assert f"(first start, from the commit in {folder})" in again.stdout, again.stdout
    assert "rank 0 of 2: start 0 at step 3" in again.stdout, again.stdout
    assert "finished: step 5, samples 10" in again.stdout, again.stdout
    assert contract.read_hosts(folder)[0] == 1, "the same hosts: the same version"
    assert [e["start"] for e in contract.read_events(folder) if e["event"] == "launch"] == \
        [1, 1]


# --- signals ------------------------------------------------------------------------------

@pytest.mark.alone
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL],
                         ids=lambda sig: sig.name)
def test_a_signal_to_the_launcher_ends_the_job_and_every_process(tmp_path, sig):
    # SIGKILL reaches no handler: the kernel ends mpirun (its parent-death signal).
    folder = tmp_path / "state"
    note_launch()
    argv = [*LAUNCHER, "-np", 3, "--state-dir", folder, *COUNTER, "--steps", 100000,
            "--step-seconds", 0.05]
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=launch_environment(),
                            start_new_session=True)
    try:
        ready = _wait_for_event(folder, "rank_start", proc)
        pids = ready["pids"] + [_parent(ready["pids"][0])]     # the ranks and mpirun
        os.kill(proc.pid, sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        launching.kill_launch(proc)
    stopped = f"stopped by {sig.name}: the job and every process"
    if sig == signal.SIGKILL:
        assert proc.returncode == -sig and stopped not in out, out
    else:
        assert proc.returncode == 128 + sig and out.count(stopped) == 1, out
    assert not [pid for pid in pids if _alive(pid)], (pids, out)


def _wait_for_event(folder, name, proc, within=60):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and proc.poll() is None:
        found = [e for e in contract.read_events(folder) if e["event"] == name] \
            if folder.exists() else []
        if found:
            return found[0]
        time.sleep(0.1)
    pytest.fail(f"no {name} event within {within} s (launcher: {proc.poll()})")


def _parent(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rpartition(")")[2].split()[1])


def _alive(pid, within=10.0):
    """Whether ``pid`` is still running (not a zombie) ``within`` seconds from now."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rpartition(")")[2].split()[0] == "Z":
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.05)
    return True


# --- bad input: one line naming the option, exit 2, nothing launched or written -------------

def _script(tmp_path, body, mode=0o755):
    path = tmp_path / "discover.sh"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(mode)
    return path


BAD = [
    (lambda t: ["--min-np", "5", "--max-np", "3", "-np", "4", "true"],
     "--min-np 5 is above --max-np 3"),
    (lambda t: ["--min-np", "x", "-np", "2", "true"], "--min-np 'x': give a whole number >= 1"),
    (lambda t: ["--max-np", "0", "-np", "2", "true"], "--max-np '0': give a whole number >= 1"),
    (lambda t: ["--max-restarts", "-1", "-np", "2", "true"],
     "--max-restarts '-1': give a whole number >= 0"),
    (lambda t: ["--restart-delay", "soon", "-np", "2", "true"],
     "--restart-delay 'soon': give a number of seconds >= 0"),
    (lambda t: ["--discovery-interval=0", "--host-discovery-script", _script(t, "true"),
                "true"], "--discovery-interval '0': give a number of seconds > 0"),
    (lambda t: ["-np", "2", "--max-np"], "--max-np needs a value"),
    (lambda t: ["-np", "2"], "--elastic needs a COMMAND to launch"),
    (lambda t: ["-np", "2", "-x", "A=1", "true"], "mpirun options must be followed by --"),
    (lambda t: ["true"], "give the hosts: --host-discovery-script S, -H HOST:SLOTS"),
    (lambda t: ["-H", "localhost:2", "--hostfile", _hostfile(t, "a"), "true"],
     "-H and --hostfile: give the hosts one way only"),
    (lambda t: ["--discovery-interval", "1", "-np", "2", "true"],
     "--discovery-interval needs --host-discovery-script"),
    (lambda t: ["--ft", "--no-ft", "-np", "2", "true"], "--ft and --no-ft: give one of them"),
    (lambda t: ["-np", "2", "--map-by", "node", "-H", "a", "--", "true"],
     "mpirun option -H: give the hosts and ranks to the launcher"),
    (lambda t: ["-H", "localhost:x", "true"],
     "-H localhost:x: 'localhost:x' is not HOST or HOST:SLOTS"),
    (lambda t: ["--hostfile", t / "none", "true"], "--hostfile "),
    (lambda t: ["--hostfile", _hostfile(t, "node1 slots=two"), "true"],
     "--hostfile "),
    (lambda t: ["--host-discovery-script", t / "none.sh", "true"], "none.sh: no such file"),
    (lambda t: ["--host-discovery-script", _script(t, "echo localhost", 0o644), "true"],
     "discover.sh: not executable (chmod +x"),
    (lambda t: ["--host-discovery-script", _script(t, "echo node down >&2; exit 3"), "true"],
     "discover.sh: exited with status 3, saying 'node down'"),
    (lambda t: ["--host-discovery-script", _script(t, "echo 'node1 node2'"), "true"],
     "discover.sh: its output, line 1: 'node1 node2' is not HOST or HOST:SLOTS"),
    (lambda t: ["--state-dir", _hostfile(t, "") / "state", "-np", "2", "true"],
     "--state-dir "),
]


def _hostfile(tmp_path, text):
    path = tmp_path / "hostfile"
    path.write_text(text)
    return path


@pytest.mark.parametrize("make_args, message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_line_naming_the_option(tmp_path, monkeypatch, capsys, make_args,
                                                 message):
    monkeypatch.setattr(launcher, "ElasticJob", _no_job)
    folder = tmp_path / "state"
    args = [str(a) for a in make_args(tmp_path)]
    if "--state-dir" not in args:
        args = ["--state-dir", str(folder), *args]
    assert launcher.main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("python -m hpctrain.launch --elastic: ") and message in err, err
    assert not folder.exists(), "nothing written"


def _no_job(*args, **kwargs):
    raise AssertionError("a job was started")


def test_too_few_slots_at_the_first_start_launch_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launcher, "ElasticJob", _no_job)
    folder = tmp_path / "state"
    args = ["--min-np", "3", "-np", "2", "--state-dir", str(folder), "true"]
    assert launcher.main(args) == contract.EXIT_TOO_FEW
    err = capsys.readouterr().err
    assert err == ("python -m hpctrain.launch --elastic: 2 rank(s) to start (2 slot(s) on "
                   "localhost:2), fewer than --min-np 3: nothing launched\n")
    assert not folder.exists()


def test_the_command_line_reaches_the_elastic_launcher():
    run = subprocess.run([*LAUNCHER, "--min-np", "3", "--max-np", "2", "-np", "2", "true"],
                         capture_output=True, text=True, timeout=60, env=launch_environment())
    assert run.returncode == 2 and run.stdout == "", run
    assert run.stderr == "python -m hpctrain.launch --elastic: --min-np 3 is above " \
                         "--max-np 2\n"


def test_elastic_comes_first():
    with pytest.raises(SystemExit, match="--elastic comes first: python -m hpctrain.launch "
                                         "--elastic -np 4 ..."):
        launch_main(["-np", "4", "--elastic", "python", "train.py"])


# --- the mpirun line, hosts, fault tolerance ------------------------------------------------

def test_each_start_exports_the_job_settings_and_its_hosts():
    settings = {contract.ENV_DIR: "/s", contract.ENV_RESTART: "0"}
    argv = launcher.elastic_command(3, [("a", 2), ("b", 1)], ["python", "t.py"],
                                    settings=settings, ulfm=False, extra=["--mca", "x", "y"])
    joined = " ".join(argv)
    assert argv[:3] == ["mpirun", "-np", "3"] and argv[-2:] == ["python", "t.py"]
    assert "-H a:2,b:1" in joined and "--with-ft" not in joined
    assert f"-x {contract.ENV_DIR}=/s -x {contract.ENV_RESTART}=0 --mca x y python" in joined
    ulfm = launcher.elastic_command(1, [("a", 1)], ["t"], settings={}, ulfm=True)
    assert "--with-ft ulfm --mca async_mpi_finalize 1" in " ".join(ulfm)
    # -np alone is this machine: no host list (see ElasticJob.start for why it matters)
    assert "-H" not in launcher.elastic_command(2, None, ["t"], settings={}, ulfm=True)


@pytest.mark.parametrize("version, probe, forced, ulfm", [
    (5, None, None, False),                           # hpctrain.mpi.ulfm cannot tell
    (5, FaultTolerance(True, "ulfm"), None, True),
    (5, FaultTolerance(False, "no ftmpi"), None, False),
    (5, lambda python: 1 / 0, None, False),           # a probe that fails: restarts
    (5, FaultTolerance(True, "ulfm"), False, False),  # --no-ft
    (5, FaultTolerance(False, "no ftmpi"), True, True),   # --ft
    (4, FaultTolerance(True, "ulfm"), None, False),   # Open MPI 4's mpirun has no --with-ft
    (0, FaultTolerance(True, "ulfm"), None, False),   # nor has another MPI's
])
def test_ulfm_when_the_mpi_and_mpirun_have_it_or_when_forced(monkeypatch, version, probe,
                                                             forced, ulfm):
    monkeypatch.setattr(launcher, "open_mpi_version", lambda mpirun: (version, "some MPI"))
    if probe is None:
        monkeypatch.delattr(mpi_ulfm, "fault_tolerance", raising=False)
    else:
        monkeypatch.setattr(mpi_ulfm, "fault_tolerance",
                            probe if callable(probe) else lambda python: probe)
    assert launcher.use_ulfm(forced, [sys.executable], "mpirun")[0] is ulfm


def test_ft_forced_on_an_mpirun_without_ulfm_is_bad_input(monkeypatch):
    monkeypatch.setattr(launcher, "open_mpi_version", lambda mpirun: (4, "Open MPI 4.1.4"))
    with pytest.raises(UsageError, match=r"^--ft: mpirun is Open MPI 4\.1\.4, which has no "
                                         r"--with-ft ulfm"):
        launcher.use_ulfm(True, ["python"], "mpirun")


def test_the_ranks_python_is_asked_about_ulfm():
    assert launcher.ranks_python([sys.executable, "train.py"]) == sys.executable
    assert launcher.ranks_python(["sh", "-c", "python train.py"]) == sys.executable


@pytest.mark.parametrize("hosts, max_np, np, used", [
    ([("a", 4)], None, 4, [("a", 4)]),
    ([("a", 4)], 3, 3, [("a", 3)]),
    ([("a", 2), ("b", 2), ("c", 2)], 3, 3, [("a", 2), ("b", 1)]),
    ([("a", 1), ("b", 1)], 8, 2, [("a", 1), ("b", 1)]),
    ([], None, 0, []),
])
def test_a_start_takes_the_first_slots_up_to_max_np(hosts, max_np, np, used):
    assert hostlists.ranks_for(hosts, max_np) == np
    assert hostlists.fit(hosts, np) == used


def test_hostfiles_in_open_mpis_form_and_ours():
    text = "# nodes\nnode1 slots=4 max_slots=8\nnode2\nnode3:2\n\n"
    assert hostlists.parse_hostfile(text, "f") == [("node1", 4), ("node2", 1), ("node3", 2)]
