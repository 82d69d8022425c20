"""The scripts in examples/ run under mpirun, with the algorithm switched from the launch."""

import re

import pytest

from hpctrain import collectives

from conftest import REPO

EXAMPLES = REPO / "examples"


# (Tree's training is the DDP example's at np 3 below.)
@pytest.mark.parametrize("np, algo", [(1, "ring"), (3, "butterfly"), (2, "horovod")])
def test_the_horovod_style_script_trains_with_any_algorithm(mpirun, np, algo):
    import sys

    run = mpirun(np, [sys.executable, EXAMPLES / "horovod_style.py", "--epochs", "3"],
                 timeout=240, env={"HPCTRAIN_ALLREDUCE": algo})
    assert run.returncode == 0, run.output
    accuracy = float(re.findall(r"test accuracy ([\d.]+)%", run.output)[-1])
    assert accuracy > 85, run.output
    assert f"ranks {np}, replicas identical: True" in run.output, run.output


@pytest.mark.parametrize("np, op, algo", [(2, "average", "ring"), (3, "sum", "ring"),
                                          (2, "sum", "horovod")])
def test_the_ddp_script_reduces_through_the_hook(mpirun, np, op, algo):
    import sys

    if algo not in collectives.available():
        pytest.skip("Horovod is not installed")
    steps = 20
    # Under horovod the hook and the rendezvous are the only users of hpctrain's own
    # communication thread, which starts for them alone.
    run = mpirun(np, [sys.executable, EXAMPLES / "ddp_hook.py", "--steps", str(steps),
                      "--op", op], timeout=240, env={"HPCTRAIN_ALLREDUCE": algo})
    assert run.returncode == 0, run.output
    assert f"ranks {np}, algorithm {algo}, op {op}" in run.output, run.output
    assert "replicas identical: True" in run.output, run.output
    # DDP's own allreduce would give identical replicas too: the hook's counts prove that
    # every gradient value went through hpctrain once per step. How many buckets DDP makes of
    # them is its own business (it rebuilds them after the first step), but more than one in
    # some step shows the hook was handed each bucket, not the whole model at once.
    counts = re.search(r"hook reduced (\d+) buckets \(at most (\d+) in one step\) and (\d+) "
                       rf"gradient values in {steps} steps; the model has (\d+) parameters",
                       run.output)
    assert counts, run.output
    buckets, most, values, parameters = map(int, counts.groups())
    assert values == parameters * steps > 0, run.output
    assert buckets >= steps and most >= 2, run.output
    # DDP alone averages: a sum (3 times the average here) can only come from the hook.
    assert "same weights as one process on the global batch: True" in run.output, run.output


def test_an_unknown_algorithm_fails_every_rank_with_the_valid_names(mpirun):
    import sys

    run = mpirun(2, [sys.executable, EXAMPLES / "horovod_style.py", "--epochs", "1"],
                 timeout=120, env={"HPCTRAIN_ALLREDUCE": "rign"})
    assert run.returncode != 0
    assert run.output.count("HPCTRAIN_ALLREDUCE='rign' is not an allreduce algorithm") == 2


@pytest.mark.parametrize("np, algo", [(3, "butterfly")])
def test_the_uneven_data_script_joins_and_ends_with_identical_replicas(mpirun, np, algo):
    import sys

    run = mpirun(np, [sys.executable, EXAMPLES / "uneven_data.py"], timeout=240,
                 env={"HPCTRAIN_ALLREDUCE": algo})
    assert run.returncode == 0, run.output
    assert f"ranks {np}, algorithm {algo}," in run.output, run.output
    steps = re.search(r"steps per rank \[([\d, ]+)\]", run.output)
    assert steps, run.output
    steps = [int(s) for s in steps.group(1).split(",")]
    # Every rank stops at a step of its own: without join the job would hang.
    assert len(steps) == np and len(set(steps)) == np, run.output
    assert f"rank {steps.index(max(steps))} joined last" in run.output, run.output
    accuracy = float(re.search(r"validation accuracy ([\d.]+)%", run.output).group(1))
    assert accuracy > 70, run.output          # 3 classes: chance is 33%
    sums = re.search(r"weight checksum per rank \[([^\]]+)\]", run.output)
    assert sums and len(set(sums.group(1).split(", "))) == 1, run.output
    assert len(sums.group(1).split(", ")) == np, run.output


def test_auto_from_the_launch_line_loads_the_profile_the_environment_names(mpirun, tmp_path):
    import json
    import sys

    # Measured winners at 2 ranks: the 20-byte allreduce of the program is nearest 8 bytes.
    profile = {"fitted": {"alpha": 2e-6, "beta": 1e-9, "gamma": 1e-10},
               "p2p_prior": {"alpha": 1e-6, "beta": 1e-9, "gamma": 1e-10},
               "measured_best": {"2": [[8, "butterfly"], [1 << 20, "ring"]]}}
    path = tmp_path / "params.json"
    path.write_text(json.dumps(profile))
    run = mpirun(2, [sys.executable, REPO / "tests" / "programs" / "allreduce_sum.py", "auto"],
                 timeout=120, env={"HPCTRAIN_ALLREDUCE_PROFILE": str(path)})
    assert run.returncode == 0, run.output
    assert "allreduce over 2 ranks: [3.0, 3.0, 3.0, 3.0, 3.0], want 3.0" in run.output


def test_auto_without_a_profile_is_one_clear_error_on_every_rank(mpirun, tmp_path):
    import sys

    missing = tmp_path / "no-such" / "params.json"
    run = mpirun(3, [sys.executable, EXAMPLES / "horovod_style.py", "--epochs", "1"],
                 timeout=120, env={"HPCTRAIN_ALLREDUCE": "auto",
                                   "HPCTRAIN_ALLREDUCE_PROFILE": str(missing)})
    assert run.returncode != 0, run.output
    # Every rank stops on the same verdict, which rank 0 reports once: what is missing and how
    # to make it. None is left waiting (mpirun's timeout above turns a hang into a failure).
    assert run.output.count(f"allreduce 'auto': no profile at '{missing}'") == 1, run.output
    assert "HPCTRAIN_ALLREDUCE_PROFILE=" in run.output
    assert "Traceback" not in run.output, run.output


# fsdp_mpi at 4 ranks with the default ring: tests/test_slurm_two_nodes.py, on two hosts.
@pytest.mark.alone
@pytest.mark.parametrize("example, np, algo", [("ddp_mpi", 2, "ring"), ("ddp_mpi", 3, "tree"),
                                               ("fsdp_mpi", 2, "butterfly")])
def test_the_torch_distributed_scripts_train_on_the_hpctrain_backend(mpirun, example, np,
                                                                      algo):
    import sys

    run = mpirun(np, [sys.executable, EXAMPLES / f"{example}.py", "--epochs", "3"],
                 timeout=240, env={"HPCTRAIN_ALLREDUCE": algo})
    assert run.returncode == 0, run.output
    accuracy = float(re.findall(r"test accuracy ([\d.]+)%", run.output)[-1])
    assert accuracy > 85, run.output
    assert f"ranks {np}, backend hpctrain, algorithm {algo}" in run.output, run.output
    if example == "ddp_mpi":
        assert "replicas identical: True" in run.output, run.output
    else:
        # Rank 0 holds its shard only: 1/np of each parameter's rows, rounded up.
        held, total = map(int, re.search(r"parameters held by rank 0: (\d+) of (\d+)",
                                         run.output).groups())
        assert total // np <= held < total, run.output


@pytest.mark.alone
def test_the_lightning_trainer_on_the_hpctrain_backend_equals_one_process(mpirun, tmp_path):
    """Lightning's ``DDPStrategy(process_group_backend="hpctrain")`` under mpirun -np 2
    learns rank and size from its MPIEnvironment and takes the steps of one process: with
    the same global batch, the final weights equal one process's up to float32 rounding."""
    import sys

    import torch

    pytest.importorskip("lightning", reason="the test extra installs Lightning: "
                                            "pip install -e '.[test]'")
    epochs, global_batch = 2, 96
    weights = {}
    for np in (1, 2):
        path = tmp_path / f"np{np}.pt"
        run = mpirun(np, [sys.executable, EXAMPLES / "lightning_mpi.py", "--epochs", str(epochs),
                          "--global-batch", str(global_batch), "--save", path],
                     timeout=300)
        assert run.returncode == 0, run.output
        environment = "MPIEnvironment" if np > 1 else "LightningEnvironment"
        assert f"ranks {np}, backend hpctrain, environment {environment}" in run.output, \
            run.output
        weights[np] = torch.load(path)
    # 14 steps an epoch (1,437 training rows cut to whole global batches): each step's
    # average over ranks rounds differently from one process's, by a few float32 epsilons
    # of the weights (at most 1) per step; 10 of them per step is ample and still tight.
    steps = epochs * (int(0.8 * 1797) // global_batch)
    atol = 10 * steps * torch.finfo(torch.float32).eps
    for name, want in weights[1].items():
        got = weights[2][name]
        assert torch.allclose(got, want, rtol=0, atol=atol), \
            f"{name}: differs from one process by {(got - want).abs().max().item():.3g}"
