"""The command line, parsed and run as a single process (no mpirun)."""

import subprocess
import sys

import pytest

from hpctrain import __version__, cli, faults, launch, runtime
from hpctrain.errors import UsageError
from hpctrain.info import format_table


def hpctrain(*args, env=None):
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_help_names_every_subcommand():
    result = hpctrain("--help")
    assert result.returncode == 0
    assert "mpirun -np 4 python -m hpctrain info" in result.stdout
    for name in cli.build_parser()._subparsers._group_actions[0].choices:
        assert name in result.stdout


def test_version():
    result = hpctrain("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"hpctrain {__version__}"


def test_missing_subcommand_is_a_usage_error():
    result = hpctrain()
    assert result.returncode == 2
    assert "required: SUBCOMMAND" in result.stderr


def test_unknown_subcommand_lists_the_valid_ones():
    result = hpctrain("trian")
    assert result.returncode == 2
    assert "invalid choice: 'trian'" in result.stderr and "'info'" in result.stderr


def test_usage_errors_are_printed_by_rank_0_only(monkeypatch):
    env = {**__import__("os").environ, "OMPI_COMM_WORLD_RANK": "1"}
    result = hpctrain("trian", env=env)
    assert result.returncode == 2 and result.stderr == ""


def test_single_process_info_runs_without_launcher():
    result = hpctrain("info")
    assert result.returncode == 0, result.stderr
    assert "hpctrain info: 1 rank" in result.stdout
    assert "world size       1" in result.stdout


@pytest.mark.parametrize("env, rank", [({}, 0), ({"OMPI_COMM_WORLD_RANK": "3"}, 3),
                                       ({"PMIX_RANK": "2"}, 2), ({"SLURM_PROCID": "5"}, 5)])
def test_launcher_rank(monkeypatch, env, rank):
    for name in runtime.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert runtime.launcher_rank() == rank


def test_run_guarded_reports_usage_errors_without_traceback(capsys):
    def bad():
        raise UsageError("--np must be >= 1, got 0")

    with pytest.raises(SystemExit) as exit_info:
        runtime.run_guarded(bad)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: --np must be >= 1, got 0" in err and "Traceback" not in err


def test_run_guarded_reports_exceptions_with_traceback(capsys):
    def broken():
        raise ZeroDivisionError("boom")

    with pytest.raises(SystemExit) as exit_info:
        runtime.run_guarded(broken)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "rank 0" in err and "Traceback" in err and "ZeroDivisionError: boom" in err


def test_run_guarded_passes_results_and_clean_exits():
    assert runtime.run_guarded(lambda: 7) == 7
    with pytest.raises(SystemExit) as exit_info:
        runtime.run_guarded(sys.exit, 0)
    assert exit_info.value.code == 0


@pytest.mark.parametrize("spec, point, rank, fails", [
    ("info.gather@1", "info.gather", 1, True),
    ("info.gather@1", "info.gather", 0, False),
    ("info.gather@1", "info.done", 1, False),
    ("info.done@0,info.gather@*", "info.gather", 5, True),
    ("", "info.gather", 0, False),
])
def test_fault_injection_selects_point_and_rank(monkeypatch, spec, point, rank, fails):
    monkeypatch.setenv(faults.ENV, spec)
    if fails:
        with pytest.raises(faults.InjectedFault, match=point):
            faults.inject(point, rank)
    else:
        faults.inject(point, rank)


# --oversubscribe whatever our core count says: Open MPI counts its slots itself (the physical
# cores hwloc finds), so a count of ours that leaves room proves nothing.
@pytest.mark.parametrize("np, cores, root, expected", [
    (4, 2, True, ["--allow-run-as-root", "--oversubscribe"]),
    (2, 2, True, ["--allow-run-as-root", "--oversubscribe"]),
    (2, 2, False, ["--oversubscribe"]),
    (3, 256, False, ["--oversubscribe"]),
])
def test_local_mpirun_flags(monkeypatch, np, cores, root, expected):
    monkeypatch.setattr(launch.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(launch.os, "geteuid", lambda: 0 if root else 1000)
    argv = launch.mpirun_command(np, ["python", "-m", "hpctrain", "info"])
    assert argv[:3] == ["mpirun", "-np", str(np)]
    flags = [a for a in argv if a in ("--allow-run-as-root", "--oversubscribe")]
    assert flags == expected
    assert argv[-4:] == ["python", "-m", "hpctrain", "info"]


def test_local_mpirun_rejects_zero_ranks():
    with pytest.raises(ValueError, match="np must be >= 1"):
        launch.mpirun_command(0, ["true"])


def test_info_table_flags_ranks_with_other_versions():
    same = {"hpctrain": "0.1.0", "torch": "2.13.0"}
    ranks = [{"rank": r, "host": f"node{r // 2}", "pid": 100 + r, "local_rank": r % 2,
              "gpu": "-", "versions": dict(same)} for r in range(4)]
    ranks[3]["versions"]["torch"] = "2.1.0"
    build = {"frameworks": ["PyTorch"], "controllers": ["MPI"], "operations": ["MPI"],
             "cuda": False}
    table = format_table(ranks, "Open MPI v4.1.4", "3.1", "no (test)", build)
    assert "hpctrain info: 4 ranks" in table
    assert "same on every rank: NO, ranks [3]" in table
    assert "frameworks: PyTorch; controllers: MPI; tensor operations: MPI" in table
    assert table.count("node1") == 2
