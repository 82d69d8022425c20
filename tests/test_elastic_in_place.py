"""Elastic training in place, on the fault-tolerant stack (``scripts/setup --ft``): a rank
SIGKILLed mid-epoch, and the others go on from the last commit on the ranks that are left.

Each job is examples/elastic_style.py (a Horovod elastic script; only its import line names
hpctrain) or ``hpctrain train --elastic``, under the stack's ``mpirun --with-ft ulfm``, with
a time limit: a survivor left waiting hangs until then, and the hang fails the test. Rank 0
logs every step (``--log``); from it the tests read how many steps the failure cost.
"""

import json
import re

import pytest

from conftest import REPO
from test_ft_stack import ft_launch

#: The fault-tolerant mpirun, with ranks killed on time: these tests run alone (scripts/test).
pytestmark = pytest.mark.alone

EXAMPLE = REPO / "examples" / "elastic_style.py"
COMMIT_EVERY = 5


def steps(log):
    """Rank 0's step records, in order."""
    return [json.loads(line) for line in log.read_text().splitlines()]


def example(ft_python, np, tmp_path, fault, *options, **env):
    log = tmp_path / "steps.jsonl"
    run = ft_launch(ft_python, np, EXAMPLE, "--epochs", "2", "--commit-every",
                    str(COMMIT_EVERY), "--log", log, *options,
                    env={"HPCTRAIN_FAULT": fault, **env})
    return run, log


def lost_steps(records, ranks_after):
    """Steps trained before the failure and trained again after it (the commit's lag)."""
    first_after = next(i for i, r in enumerate(records) if r["ranks"] == ranks_after)
    return records[first_after - 1]["step"] - (records[first_after]["step"] - 1)


# Rank 0, the root that broadcasts the commit: a middle rank (those after it renumbered) and
# the last rank die in test_two_deaths_in_a_row_leave_two_ranks.
@pytest.mark.parametrize("victim", [0])
def test_a_killed_rank_costs_the_steps_since_the_commit(ft_python, tmp_path, victim):
    run, log = example(ft_python, 4, tmp_path, f"torch.step@{victim}#12/0:kill")
    out = run.output
    assert run.returncode == 0, out
    assert "[hpctrain.elastic] lost 1 rank(s): going on with 3 of 4" in out, out
    done = re.search(r"^done: (\d+) steps on 3 ranks, test accuracy ([\d.]+)%$", out, re.M)
    assert done, out
    records = steps(log)
    assert [r["ranks"] for r in records] == sorted((r["ranks"] for r in records),
                                                   reverse=True)      # 4, then 3 for good
    assert 0 <= lost_steps(records, 3) < COMMIT_EVERY, records
    # Two epochs of digits on 3 or 4 ranks: far above chance (10 %) whatever was lost.
    assert float(done.group(2)) > 80.0, out


def test_two_deaths_in_a_row_leave_two_ranks(ft_python, tmp_path):
    run, log = example(ft_python, 4, tmp_path,
                       "torch.step@1#8/0:kill,torch.step@3#20/0:kill")
    out = run.output
    assert run.returncode == 0, out
    assert "going on with 3 of 4" in out and "going on with 2 of 3" in out, out
    assert re.search(r"^done: \d+ steps on 2 ranks", out, re.M), out
    assert [r["ranks"] for r in steps(log)][-1] == 2


def test_a_death_below_the_minimum_ends_the_job_once(ft_python, tmp_path):
    run, _ = example(ft_python, 3, tmp_path, "torch.step@2#6/0:kill",
                     HPCTRAIN_ELASTIC_MIN_NP="3")
    out = run.output
    assert run.returncode != 0, out
    lines = re.findall(r"^\[hpctrain.elastic\] error: .*$", out, re.M)
    assert lines == ["[hpctrain.elastic] error: lost 1 rank(s); 2 left is fewer than the "
                     "minimum of 3 (HPCTRAIN_ELASTIC_MIN_NP, --min-np): ending the job"], out
    assert "done:" not in out


def test_hpctrain_train_elastic_goes_on_in_place(ft_python, tmp_path):
    run = ft_launch(ft_python, 3, "-m", "hpctrain", "train", "--elastic", "--epochs", "2",
                    "--checkpoint-every", "5 steps", "--run-dir", tmp_path / "run",
                    "--progress", "never", env={"HPCTRAIN_FAULT": "train.step@1#7:kill"})
    out = run.output
    assert run.returncode == 0, out
    assert "[hpctrain.elastic] lost 1 rank(s): going on with 2 of 3" in out, out
    epochs = re.findall(r"^epoch +(\d+)/2 .* val_acc +([\d.]+)%", out, re.M)
    assert [e for e, _ in epochs] == ["1", "2"], out


def test_process_sets_that_kept_their_ranks_work_and_one_that_lost_a_rank_says_so(ft_python):
    run = ft_launch(ft_python, 4, REPO / "tests" / "programs" / "elastic_sets.py")
    out = run.output
    assert run.returncode == 0, out
    lines = sorted(re.findall(r"^rank (\d) of 3: step 5, \[0, 1\] sum (\S+), \[2, 3\]: (.*)$",
                              out, re.M))
    assert [(rank, total) for rank, total, _ in lines] == \
        [("0", "2.0"), ("1", "2.0"), ("2", "None")], out
    assert all("ranks=[2, 3]) lost rank(s) [3] when the world shrank after a failure"
               in error for _, _, error in lines), out
