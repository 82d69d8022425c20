"""``hpctrain-horovodrun``: horovodrun's command line, the mpirun or srun line it makes, bad
input, and whole launches on one host and on two emulated hosts.

The parsing and the launch lines are checked without MPI (``plan`` builds them, nothing
runs); bad input through ``main``, which must return 2 before it starts anything; the
launches through ``python -m hpctrain.launch.horovodrun``, each bounded by a timeout. The
emulated cluster (tests/test_vcluster.py's fixture) needs root and network namespaces, and is
skipped, with the reason, where they are missing.
"""

import re
import sys

import pytest

from conftest import REPO, run_bounded
from hpctrain.launch import launch_environment, mpirun_command
from hpctrain.launch.horovodrun import (EXAMPLE, MIB, NAME, REFUSED, SETTINGS, SWITCHES,
                                        exported, main, parse_options, plan)
from test_vcluster import VCLUSTER, emulated_cluster

try:
    import tomllib
except ModuleNotFoundError:     # Python < 3.11
    import tomli as tomllib

LAUNCHER = [sys.executable, "-m", "hpctrain.launch.horovodrun"]
SHOW_ENV = "tests/programs/show_env.py"
LAUNCH_TIMEOUT = 180  # s: one launch takes a few seconds here, training on two hosts ~15
#: What the variables would be on a login node: neither a Slurm allocation nor a choice.
OUTSIDE = {"PATH": "/usr/bin", "HOME": "/home/u"}
IN_ALLOCATION = {**OUTSIDE, "SLURM_JOB_ID": "42", "SLURM_NTASKS": "8"}


def launch_of(*argv, environ=OUTSIDE, tty=False):
    """The :class:`~hpctrain.launch.horovodrun.Launch` of a command line; nothing runs."""
    return plan(parse_options(argv), environ, tty=tty)


def exports(argv):
    """``{name: value}`` of the ``-x NAME=VALUE`` words of an mpirun argv."""
    pairs = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "-x"]
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)


@pytest.fixture(autouse=True)
def no_allocation(monkeypatch):
    """Tests that call ``main`` read ``os.environ``: not inside a Slurm allocation, whatever
    the machine running the tests is."""
    for name in ("SLURM_JOB_ID", "SLURM_NTASKS", "HPCTRAIN_LAUNCHER"):
        monkeypatch.delenv(name, raising=False)


# --- the launch lines ------------------------------------------------------------------------

def test_the_horovod_line_becomes_mpirun_with_the_local_flags_and_the_hosts():
    launch = launch_of("-np", "8", "-H", "host1:4,host2:4", "python", "train.py")
    base = mpirun_command(8, [])            # --allow-run-as-root as root, --oversubscribe, ...
    assert launch.argv[:len(base)] == base
    rest = launch.argv[len(base):]
    assert rest[:4] == ["--map-by", "slot", "-H", "host1:4,host2:4"]
    assert rest[-2:] == ["python", "train.py"]
    assert launch.settings == {}


def test_one_host_without_hosts_is_plain_local_mpirun():
    launch = launch_of("-np", "2", "python", "train.py")
    assert launch.argv == mpirun_command(2, ["python", "train.py"], extra=["--map-by", "slot"])


@pytest.mark.parametrize("options, variable, value", [
    (["--fusion-threshold-mb", "32"], "HOROVOD_FUSION_THRESHOLD", str(32 * MIB)),
    (["--fusion-threshold-mb=0"], "HOROVOD_FUSION_THRESHOLD", "0"),
    (["--cycle-time-ms", "2.5"], "HOROVOD_CYCLE_TIME", "2.5"),
    (["--cycle-time-ms", "5"], "HOROVOD_CYCLE_TIME", "5.0"),
    (["--cache-capacity", "512"], "HOROVOD_CACHE_CAPACITY", "512"),
    (["--hierarchical-allreduce"], "HOROVOD_HIERARCHICAL_ALLREDUCE", "1"),
    (["--no-hierarchical-allreduce"], "HOROVOD_HIERARCHICAL_ALLREDUCE", "0"),
    (["--timeline-filename", "tl.json"], "HOROVOD_TIMELINE", "tl.json"),
    (["--timeline-filename", "t", "--timeline-mark-cycles"], "HOROVOD_TIMELINE_MARK_CYCLES",
     "1"),
    (["--verbose"], "HOROVOD_LOG_LEVEL", "DEBUG"),
    (["--verbose", "--log-level", "info"], "HOROVOD_LOG_LEVEL", "INFO"),
    (["--no-stall-check"], "HOROVOD_STALL_CHECK_DISABLE", "1"),
    (["--stall-check-warning-time-seconds", "30"], "HOROVOD_STALL_CHECK_TIME_SECONDS", "30"),
    (["--autotune", "--autotune-warmup-samples", "2"], "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "2"),
    (["--tcp"], "NCCL_IB_DISABLE", "1"),
    (["--network-interfaces", "eth0", "--network-interface", "ib0"], "NCCL_SOCKET_IFNAME",
     "eth0,ib0"),
    (["--network-interface", "eth0"], "OMPI_MCA_btl_tcp_if_include", "eth0"),
])
def test_each_setting_reaches_the_ranks_as_horovods_variable(options, variable, value):
    launch = launch_of("-np", "2", *options, "python", "train.py")
    assert launch.settings[variable] == value
    assert exports(launch.argv)[variable] == value     # -x NAME=VALUE: ranks on every host
    assert launch.env[variable] == value               # and the local ranks' environment


@pytest.mark.parametrize("options, missing", [
    (["--timeline-mark-cycles"], "HOROVOD_TIMELINE_MARK_CYCLES"),     # no timeline
    (["--autotune-warmup-samples", "2"], "HOROVOD_AUTOTUNE_WARMUP_SAMPLES"),  # no --autotune
    (["--no-autotune", "--autotune-log-file", "a.csv"], "HOROVOD_AUTOTUNE_LOG"),
])
def test_settings_that_need_another_are_left_out_without_it(options, missing):
    # As horovodrun: the cycle marks go with a timeline, the autotuner's knobs with it.
    launch = launch_of("-np", "2", *options, "python", "train.py")
    assert missing not in launch.settings and missing not in exports(launch.argv)


def test_every_option_of_the_tables_parses():
    values = {"--log-level": "warning", "--autotune-gaussian-process-noise": "0.5",
              "--timeline-filename": "t.json", "--autotune-log-file": "a.csv"}
    argv = [word for option in SETTINGS for word in (option, values.get(option, "3"))]
    options = parse_options([*argv, *SWITCHES, "python", "x.py"])
    assert {variable for variable, _ in SETTINGS.values()} <= set(options.settings)
    assert options.command == ["python", "x.py"]


def test_the_command_keeps_its_own_options_and_double_dash():
    launch = launch_of("-np", "2", "--", "python", "-m", "pytest", "-k", "x", "--", "-v")
    assert launch.argv[-7:] == ["python", "-m", "pytest", "-k", "x", "--", "-v"]
    assert parse_options(["-np", "2", "python", "--cycle-time-ms", "9"]).settings == {}


def test_named_hosts_get_the_launch_environment_but_not_this_hosts_variables():
    environ = {**OUTSIDE, "HPCTRAIN_ALLREDUCE": "tree", "NCCL_DEBUG": "INFO",
               "HOSTNAME": "login1", "PWD": "/home/u", "CUDA_VISIBLE_DEVICES": "0",
               "SLURM_PROCID": "0", "BASH_FUNC_ml%%": "() { :; }", "PMIX_RANK": "0"}
    argv = launch_of("-np", "2", "-H", "a:1,b:1", "python", "t.py", environ=environ).argv
    named = {argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "-x"}
    assert {"PATH", "HOME", "HPCTRAIN_ALLREDUCE", "NCCL_DEBUG"} <= named
    assert not named & {"HOSTNAME", "PWD", "CUDA_VISIBLE_DEVICES", "SLURM_PROCID",
                        "BASH_FUNC_ml%%", "PMIX_RANK"}
    assert exported({"A_B": "1", "BAD-NAME": "1", "_": "x"}) == ["A_B"]
    # Without hosts the ranks are local and inherit the environment: nothing to name.
    assert "-x" not in launch_of("-np", "2", "python", "t.py", environ=environ).argv


def test_the_users_mpirun_words_come_last_so_they_win():
    argv = launch_of("-np", "2", "-H", "a:2", "-p", "2222", "-i", "/k/id",
                     "--binding-args=--bind-to core", "--mpi-args=--map-by ppr:1:node -x A=1",
                     "--output-filename", "logs", "--prefix-output-with-timestamp",
                     "python", "t.py").argv
    tail = argv[argv.index("--mca"):]
    assert tail == ["--mca", "plm_rsh_args", "-p 2222 -i /k/id", "--output-filename", "logs",
                    "--timestamp-output", "--bind-to", "core", "--map-by", "ppr:1:node",
                    "-x", "A=1", "python", "t.py"]
    # mpirun takes the last of a repeated option: the user's binding and mapping win.
    assert argv.index("--bind-to") < argv.index("core") and argv.count("--map-by") == 2


def test_a_hostfile_in_horovods_format(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the job's nodes\nnode01 slots=4\nnode02 slots=4 max_slots=8\n")
    argv = launch_of("-np", "6", "--hostfile", str(hostfile), "python", "t.py").argv
    assert argv[argv.index("-H") + 1] == "node01:4,node02:4"


def test_a_terminal_is_reported_to_the_ranks():
    assert exports(launch_of("-np", "2", "python", "t.py", tty=True).argv)[
        "HPCTRAIN_PROGRESS_TTY"] == "1"


def test_inside_an_allocation_srun_starts_the_tasks():
    launch = launch_of("-np", "4", "--cycle-time-ms", "3", "python", "t.py",
                       environ=IN_ALLOCATION)
    assert launch.argv == ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", "-n", "4",
                           "python", "t.py"]
    assert launch.env["HOROVOD_CYCLE_TIME"] == "3.0"     # srun hands over the environment
    # Without -np: the allocation's task count, never a number written in the script.
    assert launch_of("python", "t.py", environ=IN_ALLOCATION).argv[3:5] == ["-n", "8"]
    # The fewest nodes that hold the tasks, as hpctrain study asks of srun (not all of them).
    per_node = {**IN_ALLOCATION, "SLURM_NTASKS_PER_NODE": "2"}
    assert launch_of("-np", "4", "python", "t.py", environ=per_node).argv[3:7] == \
        ["-N", "2", "-n", "4"]


@pytest.mark.parametrize("options, environ", [
    (["-H", "a:4,b:4"], IN_ALLOCATION),                         # hosts named: mpirun
    ([], {**IN_ALLOCATION, "HPCTRAIN_LAUNCHER": "mpirun"}),     # as in jobs/
])
def test_mpirun_inside_an_allocation_when_asked(options, environ):
    launch = launch_of("-np", "8", *options, "python", "t.py", environ=environ)
    assert launch.argv[:3] == ["mpirun", "-np", "8"]


def test_the_console_script_has_a_name_of_its_own():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[NAME] == "hpctrain.launch.horovodrun:main"
    assert "horovodrun" not in scripts          # Horovod's own stays Horovod's


def test_help_and_version(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert EXAMPLE in out and "--fusion-threshold-mb" in out and "HOROVOD_CYCLE_TIME" in out
    assert main(["-v"]) == 0 and capsys.readouterr().out.startswith(f"{NAME} (hpctrain ")


# --- bad input: one message, exit 2, nothing started -----------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--no-such", "python", "t.py"], "unknown option --no-such"),
    (["-np", "2", "--fusion-threshold", "32", "python", "t.py"],
     "unknown option --fusion-threshold (did you mean --fusion-threshold-mb?)"),
    (["-np", "4", "-H", "a:1,b:2", "python", "t.py"],
     "-np 4, but -H a:1,b:2 has 3 slot(s): name more hosts or slots, or start at most 3"),
    (["-np", "2", "-H", "a:2,b:x", "python", "t.py"],
     "-H a:2,b:x: 'b:x' is not HOST or HOST:SLOTS"),
    (["-np", "2", "-H", "a:0", "python", "t.py"], "'a:0' is not HOST or HOST:SLOTS"),
    (["-np", "2", "-H", ":2", "python", "t.py"], "':2' is not HOST or HOST:SLOTS"),
    (["-np", "2", "-H", "a:2:1", "python", "t.py"], "'a:2:1' is not HOST or HOST:SLOTS"),
    (["-np", "2", "-H", ",", "python", "t.py"], "-H , names no host"),
    (["-np", "2", "-H", "a:2"], "no command to launch"),
    (["python", "t.py"], "-np N is required"),
    (["-np", "0", "python", "t.py"], "-np '0': give a whole number >= 1"),
    (["-np", "\u00b2", "python", "t.py"], "give a whole number >= 1"),
    (["-np", "2", "--cache-capacity", "\u00b2", "python", "t.py"], "give a whole number >= 0"),
    (["-np"], "-np needs a value"),
    (["-np", "2", "--cycle-time-ms", "fast", "python", "t.py"],
     "--cycle-time-ms 'fast': give a number of milliseconds >= 0"),
    (["-np", "2", "--fusion-threshold-mb", "-1", "python", "t.py"],
     "--fusion-threshold-mb '-1': give a whole number >= 0"),
    (["-np", "2", "--log-level", "loud", "python", "t.py"], "give one of TRACE, DEBUG"),
    (["-np", "2", "--verbose=1", "python", "t.py"], "--verbose takes no value"),
    (["-np", "2", "-H", "a:2", "--hostfile", "h", "python", "t.py"], "give the hosts one way"),
    (["-np", "2", "--gloo", "python", "t.py"], "--gloo does not apply to hpctrain-horovodrun"),
    (["-np", "2", "--min-np", "1", "python", "t.py"], "python -m hpctrain.launch --elastic"),
    (["-np", "2", "--host-discovery-script", "d.sh", "python", "t.py"], "--elastic"),
    (["-np", "2", "--config-file", "c.yaml", "python", "t.py"], "--fusion-threshold-mb 32"),
    (["-cb"], "python -m hpctrain info"),
    (["-np", "2", "--disable-cache", "python", "t.py"], "runs no checks of the hosts"),
])
def test_bad_input_is_one_message_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{NAME}: error: ") and message in err, err
    assert f"e.g. {EXAMPLE}" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, environ, message", [
    (["-np", "2", "-p", "2222"], IN_ALLOCATION, "-p is for mpirun, and inside this Slurm "
     "allocation the ranks are started by srun: drop -p, or set HPCTRAIN_LAUNCHER=mpirun"),
    (["-np", "2", "--mpi-args=--mca btl tcp"], IN_ALLOCATION, "--mpi-args is for mpirun"),
    (["-np", "9"], IN_ALLOCATION, "-np 9, but this Slurm allocation has 8 tasks"),
    (["-np", "2"], {**OUTSIDE, "HPCTRAIN_LAUNCHER": "srun"}, "needs a Slurm allocation"),
    (["-np", "2", "-H", "a:2"], {**IN_ALLOCATION, "HPCTRAIN_LAUNCHER": "srun"},
     "srun takes its hosts from the Slurm allocation"),
    (["-np", "2"], {**OUTSIDE, "HPCTRAIN_LAUNCHER": "ssh"}, "must be mpirun or srun"),
])
def test_what_cannot_apply_to_the_launcher_is_refused(argv, environ, message, monkeypatch,
                                                      capsys):
    for name in ("SLURM_JOB_ID", "SLURM_NTASKS", "HPCTRAIN_LAUNCHER"):
        if name in environ:
            monkeypatch.setenv(name, environ[name])
    assert main([*argv, "python", "t.py"]) == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_a_bad_hostfile_names_its_line(tmp_path, capsys):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node01 slots=4\nnode02 slots=four\n")
    assert main(["-np", "2", "--hostfile", str(hostfile), "python", "t.py"]) == 2
    assert f"--hostfile {hostfile}, line 2: 'node02:four'" in capsys.readouterr().err
    assert main(["-np", "2", "--hostfile", str(tmp_path / "none"), "python", "t.py"]) == 2
    assert "No such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize("option", sorted(REFUSED))
def test_every_refused_option_says_what_to_do_instead(option, capsys):
    assert main(["-np", "2", option, "python", "t.py"]) == 2
    assert REFUSED[option] in capsys.readouterr().err


@pytest.mark.alone
@pytest.mark.parametrize("argv", [
    ["-np", "3", "-H", "localhost:2"],
    ["-np", "2", "--no-such-option"],
])
def test_bad_input_starts_nothing(argv, tmp_path):
    # The real command, as a job script calls it: the rank would write a file if it started.
    marker = tmp_path / "started"
    done = run_bounded([*LAUNCHER, *argv, sys.executable, "-c",
                        f"open({str(marker)!r}, 'w')"], timeout=60)
    assert done.returncode == 2, done.output
    assert done.output.startswith(f"{NAME}: error: ") and done.output.count("\n") == 2, \
        done.output
    assert not marker.exists()


# --- whole launches --------------------------------------------------------------------------

@pytest.mark.alone
def test_the_horovod_example_on_one_host():
    done = run_bounded([*LAUNCHER, "-np", "2", "-H", "localhost:2", "python",
                        "examples/horovod_style.py", "--epochs", "1"],
                       timeout=LAUNCH_TIMEOUT, env=launch_environment())
    assert done.returncode == 0, done.output
    assert "ranks 2, replicas identical: True" in done.output, done.output


@pytest.mark.alone
def test_the_settings_reach_every_rank_and_verbose_shows_the_line(tmp_path):
    timeline = tmp_path / "timeline.json"
    done = run_bounded([*LAUNCHER, "-np", "2", "--verbose", "--fusion-threshold-mb", "32",
                        "--cycle-time-ms", "2.5", "--cache-capacity", "512",
                        "--hierarchical-allreduce", "--timeline-filename", timeline,
                        "python", SHOW_ENV, "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME",
                        "HOROVOD_CACHE_CAPACITY", "HOROVOD_HIERARCHICAL_ALLREDUCE",
                        "HOROVOD_TIMELINE", "HOROVOD_LOG_LEVEL"],
                       timeout=LAUNCH_TIMEOUT, env=launch_environment())
    assert done.returncode == 0, done.output
    seen = (f"HOROVOD_FUSION_THRESHOLD={32 * MIB} HOROVOD_CYCLE_TIME=2.5 "
            f"HOROVOD_CACHE_CAPACITY=512 HOROVOD_HIERARCHICAL_ALLREDUCE=1 "
            f"HOROVOD_TIMELINE={timeline} HOROVOD_LOG_LEVEL=DEBUG")
    lines = sorted(re.findall(r"<rank (\d) on \S+: (.*)>", done.output))
    assert lines == [("0", seen), ("1", seen)], done.output
    assert re.search(rf"^\[{NAME}\] \S*mpirun --tag-output -np 2 .* -x HOROVOD_CYCLE_TIME=2\.5 ",
                     done.output, re.M), done.output


# --- two emulated hosts ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """The environment of a launch on host h1 of a 2-host, 1 slot per host emulated cluster,
    with what a site's Open MPI configuration would say for it (the launch agent that enters
    a host's namespace instead of ssh; the daemons' network). The ranks' network is the
    launcher's --network-interfaces, as a Horovod job script gives it."""
    with emulated_cluster(tmp_path_factory, 2, 1, "hph") as env:
        folder = env["HPCTRAIN_VCLUSTER_DIR"]
        yield {**env, "OMPI_MCA_plm_rsh_agent": f"{folder}/agent",
               "OMPI_MCA_plm_rsh_no_tree_spawn": "1", "OMPI_MCA_oob_tcp_if_include": "vc0",
               "OMPI_MCA_btl": "self,vader,tcp"}


def on_host_1(env, *argv):
    """``hpctrain-horovodrun ARGV`` run on emulated host 1 over both hosts, bounded; a hang
    is killed with the ranks on every host."""
    return run_bounded([VCLUSTER, "exec", "1", *LAUNCHER, "-np", "2",
                        "-H", "10.77.0.1:1,10.77.0.2:1", "--network-interfaces", "vc0", *argv],
                       timeout=LAUNCH_TIMEOUT, env=env)


@pytest.mark.alone
def test_two_hosts_get_the_settings_and_the_launch_environment(two_hosts):
    done = on_host_1({**two_hosts, "HPCTRAIN_PROBE": "7"}, "--cycle-time-ms", "2.5",
                     "python", SHOW_ENV, "HOROVOD_CYCLE_TIME", "HPCTRAIN_PROBE",
                     "OMPI_MCA_btl_tcp_if_include")
    assert done.returncode == 0, done.output
    seen = "HOROVOD_CYCLE_TIME=2.5 HPCTRAIN_PROBE=7 OMPI_MCA_btl_tcp_if_include=vc0"
    assert sorted(re.findall(r"<rank (\d) on (\S+): (.*)>", done.output)) == \
        [("0", "h1", seen), ("1", "h2", seen)], done.output


@pytest.mark.alone
def test_the_horovod_example_across_two_hosts(two_hosts):
    done = on_host_1(two_hosts, "python", "examples/horovod_style.py", "--epochs", "1")
    assert done.returncode == 0, done.output
    assert "ranks 2, replicas identical: True" in done.output, done.output
    accuracy = re.search(r"^\[0\]<stdout>:epoch 1: .* test accuracy ([\d.]+)%$", done.output,
                         re.M)
    assert accuracy and float(accuracy.group(1)) > 50.0, done.output


def test_a_launcher_run_from_a_virtual_environment_puts_its_bin_first(monkeypatch):
    from hpctrain.launch.horovodrun import with_this_python

    monkeypatch.setattr(sys, "prefix", "/opt/job/.venv")
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    got = with_this_python({"PATH": "/usr/bin:/bin", "HOME": "/home/u"})
    assert got == {"PATH": "/opt/job/.venv/bin:/usr/bin:/bin", "HOME": "/home/u"}
    assert with_this_python(got) == got                 # not twice
    monkeypatch.setattr(sys, "base_prefix", "/opt/job/.venv")
    assert with_this_python({"PATH": "/usr/bin"}) == {"PATH": "/usr/bin"}   # no venv: as is
