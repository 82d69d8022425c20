"""The stall watchdog, on jobs launched with mpirun (an abort would end an in-process suite)."""

import re
import sys
from pathlib import Path

STALL = Path(__file__).parent / "programs" / "stall.py"
WARNING = 1     # s: stall.py's StallWatchdog(warning=1.0)


def waited(output, message):
    """The whole seconds of each ``message`` in ``output`` (a regex with ``{s}`` where the
    watchdog writes how long it has waited, rounded)."""
    return [int(s) for s in re.findall(message.format(s=r"(\d+)"), output)]


def test_a_late_rank_is_named_and_the_job_still_finishes(mpirun):
    delay = 2.5
    result = mpirun(3, [sys.executable, STALL, "30", str(delay)], timeout=60)
    assert result.returncode == 0, result.output
    warnings = waited(result.output, r"stall: 'allreduce step 2' \(collective #3\) has waited "
                                     r"{s} s for rank\(s\) \[2\], which have not reached it")
    # Logged once, at the first check after the warning time. Rank 0's watchdog thread
    # checks every 50 ms, but on a busy machine it may run late and say 2 rather than 1:
    # never less than the warning, never more than the stall (plus the time the late rank's
    # arrival takes to be seen).
    assert len(warnings) == 1, result.output
    assert WARNING <= warnings[0] <= delay + 0.5, result.output
    assert "finished" in result.output


def test_a_stuck_rank_aborts_the_job_after_the_timeout(mpirun):
    # Rank 2 would sleep 600 s: only the abort can end the job within the launch's 60 s (a
    # job still running then fails the test as hung).
    result = mpirun(3, [sys.executable, STALL, "3", "600"], timeout=60)
    assert result.returncode != 0
    aborts = waited(result.output, r"has waited {s} s for rank\(s\) \[2\], which have not "
                                   r"reached it; aborting \(stall timeout 3 s\)")
    # Counted by the watchdog from the stall's start, so the launch's start-up is not in it:
    # the first check after the 3 s timeout, or a few seconds later if a busy machine starves
    # the watchdog's thread.
    assert len(aborts) == 1 and 3 <= aborts[0] <= 10, result.output
    assert "finished" not in result.output


def test_no_stall_no_message(mpirun):
    result = mpirun(2, [sys.executable, STALL, "30", "0"], timeout=60)
    assert result.returncode == 0 and "stall" not in result.output
