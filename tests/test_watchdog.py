"""The stall watchdog, on jobs launched with mpirun (an abort would end an in-process suite)."""

import sys
from pathlib import Path

STALL = Path(__file__).parent / "programs" / "stall.py"


def test_a_late_rank_is_named_and_the_job_still_finishes(mpirun):
    result = mpirun(3, [sys.executable, STALL, "30", "2.5"], timeout=60)
    assert result.returncode == 0, result.output
    assert ("stall: 'allreduce step 2' (collective #3) has waited 1 s for rank(s) [2], which "
            "have not reached it") in result.output
    assert "finished" in result.output


def test_a_stuck_rank_aborts_the_job_after_the_timeout(mpirun):
    result = mpirun(3, [sys.executable, STALL, "3", "600"], timeout=60)
    assert result.returncode != 0
    assert "for rank(s) [2], which have not reached it; aborting (stall timeout 3 s)" \
        in result.output
    assert result.elapsed < 40
    assert "finished" not in result.output


def test_no_stall_no_message(mpirun):
    result = mpirun(2, [sys.executable, STALL, "30", "0"], timeout=60)
    assert result.returncode == 0 and "stall" not in result.output
