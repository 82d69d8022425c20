"""A user's own script that dies on one rank ends the job: ``hpctrain.torch.init()`` installs
the guard of ``python -m hpctrain`` (``hpctrain.runtime.guard``). Without it the other ranks
wait in their next collective until the launcher is killed (Horovod 0.28.1 does that).
"""

import os
import re
import subprocess
import sys

import pytest

from hpctrain import runtime

WITHIN = 10   # s from the raise to the end of mpirun
HANG = 120    # s: the mpirun fixture kills a launch that takes longer and fails the test

#: A script as users write them: init, a collective every rank completes, then rank BAD
#: raises (a bug, a bad batch) while the others go on to the next collective and wait there.
SCRIPT = """
import sys
import time

import torch

import hpctrain.torch as hvd

bad = int(sys.argv[1])
hvd.init()
x = hvd.allreduce(torch.ones(4), name="before")
if hvd.rank() == bad:
    print(f"rank {bad} raises at t={time.time():.3f}", flush=True)
    raise RuntimeError(f"a bug on rank {bad}")
hvd.allreduce(x, name="waits for the failed rank")
print(f"rank {hvd.rank()} was not stopped", flush=True)
"""


def run_script(mpirun, np, bad, algo, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return mpirun(np, [sys.executable, script, bad], timeout=HANG,
                  env={"HPCTRAIN_ALLREDUCE": algo})


def seconds_after_raise(run):
    raised = re.search(r"rank \d+ raises at t=([\d.]+)", run.output)
    assert raised, run.output
    return run.ended - float(raised.group(1))


# The first, a middle and the last rank, at 2 to 4 ranks (the guard has no other case).
@pytest.mark.parametrize("np, bad", [(2, 1), (3, 0), (3, 1), (4, 3)])
def test_a_rank_that_raises_ends_the_job(mpirun, tmp_path, np, bad):
    run = run_script(mpirun, np, bad, "ring", tmp_path)
    assert run.returncode != 0, run.output
    assert f"[hpctrain] rank {bad} of {np} on" in run.output, run.output
    assert "Traceback (most recent call last)" in run.output
    assert f"RuntimeError: a bug on rank {bad}" in run.output
    assert "was not stopped" not in run.output
    assert seconds_after_raise(run) < WITHIN, run.output


def test_the_guard_ends_a_horovod_job_too(mpirun, tmp_path):
    # With HPCTRAIN_ALLREDUCE=horovod every call goes to Horovod's own background thread,
    # which would wait forever for the failed rank's tensor.
    run = run_script(mpirun, 2, 1, "horovod", tmp_path)
    assert run.returncode != 0, run.output
    assert "[hpctrain] rank 1 of 2 on" in run.output, run.output
    assert seconds_after_raise(run) < WITHIN, run.output


def guarded_hook(env):
    """The ``sys.excepthook`` that a process with ``env`` has after ``guard()``."""
    code = ("import sys; from hpctrain import runtime; runtime.guard(); "
            "print(sys.excepthook is runtime._ending_hook)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60, check=True)
    return done.stdout.strip()


def test_the_guard_can_be_turned_off():
    base = {k: v for k, v in os.environ.items() if k != runtime.GUARD_VARIABLE}
    assert guarded_hook(base) == "True"
    assert guarded_hook({**base, runtime.GUARD_VARIABLE: "0"}) == "False"


def test_alone_the_hook_is_pythons(tmp_path):
    # One process, no MPI: an uncaught exception is Python's usual traceback and status 1.
    script = tmp_path / "alone.py"
    script.write_text("from hpctrain import runtime\nruntime.guard()\nraise KeyError('k')\n")
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "KeyError: 'k'" in done.stderr and "[hpctrain]" not in done.stderr
