"""Horovod scripts as they are written, under hpctrain.torch: MPI left to ``init``
(``mpi4py.rc.initialize = False``), process sets from each rank's communicator, ``init(comm=
[ranks])``, and Horovod's ``HOROVOD_*`` settings (read by :mod:`hpctrain.torch.settings`).

The settings' parsing and the stall inspector's shutdown are checked here without MPI; the
habits by launching tests/programs/horovod_habits.py at np 2 and 3, each launch bounded.
"""

import sys

import pytest

from conftest import launch
from hpctrain.errors import UsageError
from hpctrain.torch import settings
from hpctrain.torch.engine import OpKey, StallInspector
from hpctrain.torch.ops.common import signature

PROGRAM = "tests/programs/horovod_habits.py"
TIMEOUT = 120  # s: a launch takes 5-15 s here


def run_mode(np, mode, env=None):
    return launch(np, [sys.executable, PROGRAM, mode], timeout=TIMEOUT, env=env)


# ----- the settings, without MPI -------------------------------------------------------------

def test_horovod_variables_take_effect_with_horovods_meaning():
    got = settings.read({"HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_CACHE_CAPACITY": "0",
                         "HOROVOD_STALL_CHECK_TIME_SECONDS": "30",
                         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "90",
                         "HOROVOD_FUSION_THRESHOLD": str(8 * 2**20),
                         "HOROVOD_TIMELINE": "t.json", "HOROVOD_TIMELINE_MARK_CYCLES": "1",
                         "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"})
    assert (got.cycle_s, got.cache_capacity, got.stall_check_s, got.stall_shutdown_s) == \
        (0.0025, 0, 30.0, 90.0)
    assert (got.fusion_bytes, got.timeline, got.mark_cycles, got.hierarchical) == \
        (8 * 2**20, "t.json", True, True)
    assert got.ignored == ()


def test_hpctrains_own_variable_wins_over_its_horovod_twin():
    got = settings.read({"HPCTRAIN_CYCLE_TIME_MS": "3", "HOROVOD_CYCLE_TIME": "7",
                         "HPCTRAIN_STALL_CHECK_S": "5", "HOROVOD_STALL_CHECK_DISABLE": "0"})
    assert (got.cycle_s, got.stall_check_s) == (0.003, 5.0)
    assert settings.read({"HOROVOD_STALL_CHECK_DISABLE": "1"}).stall_check_s == 0


def test_the_start_up_bound_is_read_in_seconds_and_scaled_to_the_ranks_when_unset():
    assert settings.read({"HPCTRAIN_START_TIMEOUT_S": "45"}).start_timeout_s == 45.0
    assert settings.read({"HPCTRAIN_START_TIMEOUT_S": "0"}).start_timeout_s == 0.0
    assert settings.read({}).start_timeout_s is None       # hpctrain.startup.timeout's


def test_defaults_are_horovods():
    got = settings.read({})
    assert (got.cycle_s, got.stall_check_s, got.stall_shutdown_s, got.cache_capacity) == \
        (0.001, 60.0, 0.0, 1024)
    assert got.fusion_bytes is None and got.timeline is None and not got.hierarchical


def test_ignored_variables_are_named_once_with_why_and_their_off_values_are_not():
    got = settings.read({"HOROVOD_AUTOTUNE": "1", "HOROVOD_NUM_NCCL_STREAMS": "2",
                         "HOROVOD_CPU_OPERATIONS": "mpi", "HOROVOD_THREAD_AFFINITY": "0"})
    assert [name for name, _ in got.ignored] == ["HOROVOD_AUTOTUNE", "HOROVOD_NUM_NCCL_STREAMS"]
    message = settings.ignored_message(got)
    assert message.count("HOROVOD_AUTOTUNE (") == 1 and "docs/torch.md" in message
    assert settings.ignored_message(settings.read({})) is None


def test_every_variable_has_a_kind_and_a_reason():
    for name, (kind, why) in settings.HOROVOD_VARIABLES.items():
        assert name.startswith("HOROVOD_") and kind in ("honoured", "mapped", "ignored") and why


@pytest.mark.parametrize("name, value, example", [
    ("HOROVOD_CYCLE_TIME", "fast", "HOROVOD_CYCLE_TIME=1"),
    ("HOROVOD_CACHE_CAPACITY", "1.5", "HOROVOD_CACHE_CAPACITY=1024"),
    ("HOROVOD_FUSION_THRESHOLD", "-1", "HOROVOD_FUSION_THRESHOLD=67108864"),
    ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "nan", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=120"),
    ("HOROVOD_TIMELINE_MARK_CYCLES", "maybe", "HOROVOD_TIMELINE_MARK_CYCLES=1"),
    ("HPCTRAIN_START_TIMEOUT_S", "-5", "HPCTRAIN_START_TIMEOUT_S=300"),
])
def test_a_value_that_does_not_parse_names_the_variable_and_an_example(name, value, example):
    with pytest.raises(UsageError) as error:
        settings.read({name: value})
    assert repr(value) in str(error.value) and example in str(error.value)


class _Waiting:
    """A table entry first seen at rank 0's clock ``first``."""

    def __init__(self, first):
        self.first, self.signatures = first, {0: signature("allreduce")}


def test_the_stall_shutdown_is_decided_from_rank_0s_clock_alike_everywhere():
    table = {OpKey(0, "allreduce.w"): _Waiting(first=10.0)}
    for rank in (0, 1):
        inspector = StallInspector(rank, settings.Settings(stall_shutdown_s=5.0))
        inspector.note([True, False], 14.9)
        assert inspector.shutdown(table, lambda key, entry: [1]) is None
        inspector.note([True, False], 15.0)
        why = inspector.shutdown(table, lambda key, entry: [1])
        assert "stall: 'allreduce.w' has waited 5 s for rank(s) [1], which have not " \
            "asked for it (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=5)" == why
    never = StallInspector(0, settings.Settings())
    never.note([True, False], 1e6)
    assert never.shutdown(table, lambda key, entry: [1]) is None


# ----- the habits, launched ------------------------------------------------------------------

@pytest.mark.alone
# At np 3: a split with a set of one rank and one of two (the MPI suite covers np 1 to 4).
@pytest.mark.parametrize("np", [3])
@pytest.mark.parametrize("mode", ["uninit", "split", "dynamic", "comm-list"])
def test_a_horovod_habit_behaves_as_under_horovod(np, mode):
    run = run_mode(np, mode)
    assert run.returncode == 0 and "FAILED" not in run.output and "ok " in run.output, \
        run.output[-3000:]


@pytest.mark.alone
def test_horovod_timeline_is_written_by_rank_0_with_its_cycles(tmp_path):
    path = tmp_path / "timeline.json"
    run = run_mode(2, "timeline", {"HOROVOD_TIMELINE": str(path),
                                   "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    assert run.returncode == 0 and "FAILED" not in run.output, run.output[-3000:]
    assert path.exists() and [p.name for p in tmp_path.iterdir()] == ["timeline.json"]


@pytest.mark.alone
def test_a_stall_past_the_shutdown_time_fails_every_rank_instead_of_waiting():
    run = run_mode(3, "stall-shutdown", {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "1"})
    assert run.returncode == 0 and "ok a stall of 1 s" in run.output, run.output[-3000:]


@pytest.mark.alone
@pytest.mark.parametrize("name, value, said", [
    ("HOROVOD_FUSION_THRESHOLD", "64MB", "HOROVOD_FUSION_THRESHOLD='64MB' is not a whole number"),
    pytest.param("HPCTRAIN_START_TIMEOUT_S", "soon", "HPCTRAIN_START_TIMEOUT_S='soon' is not a "
                 "number >= 0: e.g. HPCTRAIN_START_TIMEOUT_S=300"),
], ids=["horovod", "start-timeout"])
def test_a_bad_horovod_value_stops_every_rank_with_status_2_before_mpi(name, value, said):
    run = run_mode(2, "uninit", {name: value})
    assert run.returncode == 2, run.output[-3000:]
    assert run.output.count(said) == 2, run.output[-3000:]
    assert "Traceback" not in run.output and "ok " not in run.output


@pytest.mark.alone
def test_ignored_horovod_variables_are_named_once_by_rank_0():
    run = run_mode(3, "uninit", {"HOROVOD_AUTOTUNE": "1"})
    assert run.returncode == 0, run.output[-3000:]
    assert run.output.count("ignores these Horovod settings") == 1
    assert "HOROVOD_AUTOTUNE (no run-time tuner" in run.output


@pytest.mark.alone
def test_a_process_set_outside_the_world_stops_every_rank_with_status_2():
    run = run_mode(2, "bad-set")
    assert run.returncode == 2, run.output[-3000:]
    assert "a process set needs ranks from 0 to 1, got [0, 99]" in run.output
    assert "Traceback" not in run.output


def test_docs_table_lists_every_horovod_variable_as_the_code_treats_it():
    from conftest import REPO

    text = (REPO / "docs" / "torch.md").read_text()
    for name, (kind, _) in settings.HOROVOD_VARIABLES.items():
        assert f"| `{name}` | {kind} |" in text, name
