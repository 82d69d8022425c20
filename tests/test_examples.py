"""The scripts in examples/ run under mpirun, with the algorithm switched from the launch."""

import re

import pytest

from conftest import REPO

EXAMPLES = REPO / "examples"


@pytest.mark.parametrize("np, algo", [(1, "ring"), (2, "tree"), (3, "butterfly"),
                                      (2, "horovod")])
def test_the_horovod_style_script_trains_with_any_algorithm(mpirun, np, algo):
    import sys

    run = mpirun(np, [sys.executable, EXAMPLES / "horovod_style.py", "--epochs", "3"],
                 timeout=240, env={"HPCTRAIN_ALLREDUCE": algo})
    assert run.returncode == 0, run.output
    accuracy = float(re.findall(r"test accuracy ([\d.]+)%", run.output)[-1])
    assert accuracy > 85, run.output
    assert f"ranks {np}, replicas identical: True" in run.output, run.output


@pytest.mark.parametrize("np", [2, 4])
def test_the_ddp_script_reduces_through_the_hook(mpirun, np):
    import sys

    run = mpirun(np, [sys.executable, EXAMPLES / "ddp_hook.py"], timeout=240,
                 env={"HPCTRAIN_ALLREDUCE": "ring"})
    assert run.returncode == 0, run.output
    assert f"ranks {np}, algorithm ring" in run.output, run.output
    assert "replicas identical: True" in run.output, run.output


def test_an_unknown_algorithm_fails_every_rank_with_the_valid_names(mpirun):
    import sys

    run = mpirun(2, [sys.executable, EXAMPLES / "horovod_style.py", "--epochs", "1"],
                 timeout=120, env={"HPCTRAIN_ALLREDUCE": "rign"})
    assert run.returncode != 0
    assert run.output.count("HPCTRAIN_ALLREDUCE='rign' is not an allreduce algorithm") == 2
