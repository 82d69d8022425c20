"""Shared test set-up.

Two kinds of tests live here:

- serial tests (no ``mpi`` marker) run under plain pytest; those that need several ranks
  launch ``mpirun`` themselves through the ``mpirun`` fixture, which kills a launch that
  outlives its timeout and fails with the command that hung;
- MPI tests (``tests/mpi``, ``@pytest.mark.mpi``) run *under* mpirun:
  ``mpirun -np N python -m pytest --with-mpi -m mpi tests/mpi`` (scripts/test does it for
  N = 1..4). Each rank writes its own JUnit file; scripts/test keeps ranks > 0 off the
  terminal (scripts/rank0-output).
"""

import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpctrain import launch as launching
from hpctrain.collectives import ALGORITHMS
from hpctrain.data import synthetic
from hpctrain.launch import launch_environment, mpirun_command
from hpctrain.mpi.ulfm import fault_tolerance
from hpctrain.train import TrainConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Under ``--with-mpi``, give every rank > 0 a JUnit file of its own (``...-rankR.xml``)."""
    if not config.getoption("with_mpi", default=False):
        return
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    if rank == 0:
        return
    xml = config.option.xmlpath
    if xml:
        config.option.xmlpath = f"{Path(xml).with_suffix('')}-rank{rank}.xml"


#: Fixtures that start launches of their own (mpirun, the fault-tolerant stack's mpirun): a
#: test that takes one is marked ``alone`` without saying so itself.
LAUNCHING_FIXTURES = frozenset({"mpirun", "ft_python"})
#: Whether the test running now is marked ``alone`` (set before each test; read by
#: :func:`note_launch`).
_RUNNING_ALONE = False


@pytest.hookimpl(tryfirst=True)    # before ``-m`` selects by marker
def pytest_collection_modifyitems(config, items):
    """Mark ``alone`` every test that takes a fixture of ``LAUNCHING_FIXTURES``."""
    for item in items:
        if LAUNCHING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.alone)


def pytest_runtest_setup(item):
    """Note whether ``item`` is marked ``alone``, for :func:`note_launch`."""
    global _RUNNING_ALONE
    _RUNNING_ALONE = item.get_closest_marker("alone") is not None


class MpirunHung(AssertionError):
    """An mpirun launch that did not finish within its timeout (it has been killed)."""


@dataclass
class Launch:
    """A finished mpirun launch."""

    argv: list
    returncode: int
    output: str
    elapsed: float
    ended: float = 0.0     # time.time() when it ended, to compare with times the job printed


def launch(np, command, *, timeout, env=None):
    """Run ``command`` on ``np`` local ranks; raise ``MpirunHung`` if it outlives ``timeout``."""
    argv = mpirun_command(np, [str(c) for c in command])
    return run_bounded(argv, timeout=timeout, env={**launch_environment(), **(env or {})})


def run_bounded(argv, *, timeout, env=None):
    """Run ``argv`` (a launcher: mpirun, scripts/vcluster mpirun, ...) from the project root,
    stdout and stderr together, and return its ``Launch``. If it outlives ``timeout`` it is
    killed with everything it started and ``MpirunHung`` is raised with its output."""
    note_launch()
    start = time.monotonic()
    try:
        done = launching.run_bounded(argv, timeout, env=env, cwd=REPO)
    except launching.LaunchHung as hung:
        raise MpirunHung(f"launch hung: {hung} and was killed. Its output:\n"
                         f"{hung.output[-4000:]}") from None
    return Launch(done.args, done.returncode, done.stdout, time.monotonic() - start, time.time())


#: A file to which every test that starts a launch appends its id (scripts/flake-gate).
LAUNCH_LOG = "HPCTRAIN_LAUNCH_LOG"


def note_launch():
    """Record the running test in ``$HPCTRAIN_LAUNCH_LOG``, when set: scripts/flake-gate
    repeats exactly the tests that launch jobs, which are the ones timing can break. Under
    pytest-xdist, a test not marked ``alone`` that launches fails here: it would run beside
    other tests, which is what makes launches flaky."""
    if os.environ.get("PYTEST_XDIST_WORKER") and not _RUNNING_ALONE:
        raise AssertionError(
            "this test starts a launch of its own but runs beside other tests: mark it "
            "@pytest.mark.alone (scripts/test runs such tests one at a time, after the others)")
    log, test = os.environ.get(LAUNCH_LOG), os.environ.get("PYTEST_CURRENT_TEST")
    if log and test:
        with open(log, "a") as f:
            f.write(test.rsplit(" (", 1)[0] + "\n")


def seconds_after_fault(run):
    """Seconds from the (first) fault injected by ``HPCTRAIN_FAULT`` (which prints its time,
    ``t=...``) to the end of the ``Launch``: the job's reaction, without its start-up."""
    fired = re.search(r"\[hpctrain\] fault .* fires on rank \d+: .* \(t=([\d.]+)\)", run.output)
    assert fired, run.output
    return run.ended - float(fired.group(1))


def assert_ended_by(run, fault, *, np, within):
    """``run`` ended non-zero within ``within`` s of ``fault`` (``POINT@RANK[#N]``) firing,
    with the failing rank's traceback, and, for a job of ``np`` ranks, the rank named (a
    process that is no MPI job, ``np=None``, names no world size)."""
    point, rank = fault.split("@")[0], int(fault.split("@")[1].split("#")[0])
    assert run.returncode != 0, run.output
    if np is not None:
        assert f"[hpctrain] rank {rank} of {np} on" in run.output, run.output
    assert "Traceback (most recent call last)" in run.output, run.output
    assert f"InjectedFault: injected fault at '{point}' on rank {rank}" in run.output, run.output
    assert seconds_after_fault(run) < within, run.output


def assert_root_cause(output, *, rank, size, host, error):
    """``output`` ends with one root-cause block (``hpctrain.launch.output``) that names
    ``rank`` (of ``size``), ``host`` and ``error``, with the frame of
    tests/programs/fail_on_rank.py that raised it."""
    assert output.count("Root cause") == 1, output
    block = output[output.rindex("=" * 78, 0, output.index("Root cause")):].strip()
    assert block.endswith("=" * 78) and output.rstrip().endswith(block), output
    assert f"  rank:   {rank} (of {size})\n  host:   {host}\n" in block, block
    assert re.search(r"^  exit:   status 1$", block, re.M), block
    assert f"  error:  {error}\n" in block, block
    assert re.search(r'^ +\(File ".*fail_on_rank\.py", line \d+, in <module>\)$', block,
                     re.M), block


@pytest.fixture
def mpirun():
    """``mpirun(np, command, timeout=..., env=...) -> Launch``; a hang raises ``MpirunHung``."""
    return launch


#: The fault-tolerant stack's environment (``scripts/setup --ft``), set by scripts/test.
FT_VENV = "HPCTRAIN_FT_VENV"


@pytest.fixture(scope="session")
def ft_python():
    """The python of the fault-tolerant stack (``$HPCTRAIN_FT_VENV/bin/python``: mpi4py on
    an MPI with ULFM). Where ``HPCTRAIN_FT_VENV`` is set (scripts/test, CI) a missing or not
    fault-tolerant stack fails the test: CI must not skip it in silence. Unset (pytest run by
    hand), the test is skipped, saying how to get the stack."""
    folder = os.environ.get(FT_VENV)
    if not folder:
        pytest.skip(f"needs the fault-tolerant MPI stack: scripts/setup --ft, then "
                    f"{FT_VENV}={REPO / '.venv-ft'} (scripts/test does both)")
    python = Path(folder) / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{FT_VENV}={folder}, but it has no bin/python: run scripts/setup --ft "
                    f"(with HPCTRAIN_VENV={folder} for a folder other than .venv-ft)")
    verdict = fault_tolerance(str(python))
    if not verdict.available:
        pytest.fail(f"{FT_VENV}={folder} is not fault tolerant: {verdict.detail}")
    return python


@pytest.fixture
def hpctrain_cmd():
    """The command that runs ``python -m hpctrain`` with this interpreter."""
    return [sys.executable, "-m", "hpctrain"]


# --- for the tests that run under mpirun (tests/mpi, tests/gpu) --------------------------------

@pytest.fixture(scope="module")
def comm():
    """``MPI.COMM_WORLD`` (imported here, so the serial tests never initialise MPI)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def from_rank0(comm, make):
    """``make()`` called on rank 0 only; its (picklable) result on every rank. Collective.

    Each rank runs its own pytest process with its own ``tmp_path``: files every rank must
    read are written by rank 0 into its directories, and their names broadcast.
    """
    return comm.bcast(make() if comm.rank == 0 else None, root=0)


def all_ranks(comm, ok, failures=()):
    """Assert ``ok`` on every rank at once (collective): a rank that failed alone would leave
    the others waiting in the next collective. The message holds every rank's failures."""
    everyone = comm.allgather((bool(ok), [str(f) for f in failures][:10]))
    lines = [f"rank {rank}: {f}" for rank, (_, fails) in enumerate(everyone) for f in fails]
    assert all(good for good, _ in everyone), "\n".join(lines) or "failed on some rank"


def abort_on_error(call, *args, **kwargs):
    """``call(*args, **kwargs)``; an unexpected exception (a bug in a data phase, not a
    ``UsageError``) ends the whole job with its traceback instead of leaving the other ranks
    waiting for this one."""
    import traceback

    from mpi4py import MPI

    from hpctrain.errors import UsageError

    try:
        return call(*args, **kwargs)
    except UsageError:
        raise
    except Exception:  # noqa: BLE001 - reported, then the job ends
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


def raised(call):
    """The exception ``call()`` raised, or ``None``. Error tests check it with ``all_ranks``
    after the world's next collective: a rank where ``pytest.raises`` failed alone would skip
    that collective and leave the others waiting in it."""
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the caller checks what it was
        return error
    return None


#: Registered allreduce algorithms that hpctrain.torch's own tests leave out, and why. Every
#: other one is in ``TORCH_ALGOS``, so a new algorithm is tested from the day it registers.
#: (``auto``, which ``init`` also accepts, is no registered algorithm but a choice among
#: them per message size that needs a study's profile: tests/mpi/test_auto_allreduce.py and
#: tests/mpi/test_train_equivalence.py run it.)
NOT_TORCH_ALGOS = {
    "horovod": "hands every call to the real Horovod, whose behaviour is not hpctrain's "
               "(it refuses bool tensors, for one): tests/mpi/test_torch_matches_horovod.py "
               "runs it beside ours",
}
#: The algorithms hpctrain.torch's own tests run over: the registry's, in its order (the
#: same on every rank, as parametrised tests must be), less ``NOT_TORCH_ALGOS``.
TORCH_ALGOS = [name for name in ALGORITHMS if name not in NOT_TORCH_ALGOS]


@pytest.fixture(params=TORCH_ALGOS, scope="module")
def torch_algo(request):
    """hpctrain.torch started with each algorithm of ``TORCH_ALGOS`` in turn, one ``init``
    and one ``shutdown`` per algorithm and test module."""
    import hpctrain.torch as hvd

    hvd.init(allreduce=request.param)
    yield request.param
    hvd.shutdown()


@pytest.fixture(params=TORCH_ALGOS, scope="module")
def dist_algo(request):
    """``torch.distributed``'s default group on the ``hpctrain`` backend over each algorithm
    of ``TORCH_ALGOS`` in turn (``HPCTRAIN_ALLREDUCE``, as a script sets it), one group per
    algorithm and test module."""
    import datetime

    import torch.distributed as dist

    import hpctrain.torch.distributed  # noqa: F401 - registers the backend

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HPCTRAIN_ALLREDUCE", request.param)
        dist.init_process_group("hpctrain", timeout=datetime.timedelta(seconds=120))
        yield request.param
        dist.destroy_process_group()


# --- a small data set and a short training run ---------------------------------------------------

@dataclass(frozen=True)
class SyntheticData:
    """A synthetic data set (:func:`hpctrain.data.synthetic.write`): ``rows`` samples of
    ``shape`` over ``classes`` classes, drawn from ``seed``."""

    rows: int
    shape: tuple
    classes: int
    seed: int = 0
    noise: float = 1.0

    def write(self, path):
        """Write it to ``path``; return the path."""
        return synthetic.write(path, self.rows, self.shape, self.classes, seed=self.seed,
                               noise=self.noise)


#: The ``data_file`` of a module that sets no ``DATA``: 40 rows, which ``config`` splits into
#: 30 training rows, 3 per rank and step: padded last batches at N = 3 and 4, exact at N = 2.
SMALL_DATA = SyntheticData(rows=40, shape=(1, 3, 3), classes=3, seed=7, noise=0.5)
#: ``config``'s batch on each rank.
PER_RANK_BATCH = 3


def on_every_rank(request, make):
    """``make()``'s result. Under ``--with-mpi`` rank 0 makes it and every rank gets it
    (collective, see :func:`from_rank0`); in a serial run the one process makes it."""
    if request.config.getoption("with_mpi", default=False):
        return from_rank0(request.getfixturevalue("comm"), make)
    return make()


@pytest.fixture(scope="module")
def data_file(request, tmp_path_factory):
    """The test module's ``DATA`` (a :class:`SyntheticData`; ``SMALL_DATA`` where it sets
    none), written once per module. A module whose tests count on its data (steps per epoch,
    an accuracy, a batch that cannot be filled) sets ``DATA`` next to those counts."""
    data = getattr(request.module, "DATA", SMALL_DATA)
    return on_every_rank(request,
                         lambda: data.write(tmp_path_factory.mktemp("data") / "synthetic.h5"))


@pytest.fixture
def config(request, data_file, tmp_path):
    """Two epochs of plain SGD on ``data_file`` with nothing that depends on the number of
    ranks (no learning-rate scaling, warm-up or decay), so N ranks with batch b must reach
    the weights of one process with batch N·b; tiny buckets (~100 bytes) give several
    buckets, of uneven sizes, so bucket order and overlap matter. Its run directory is rank
    0's ``tmp_path``. A module whose tests need other settings defines its own ``config``."""
    run_dir = on_every_rank(request, lambda: str(tmp_path))
    return TrainConfig(data=str(data_file), run_dir=run_dir, hidden=8, epochs=2,
                       batch_size=PER_RANK_BATCH, val_fraction=0.25, lr=0.1, momentum=0.9,
                       weight_decay=0.01, lr_scaling="none", warmup_epochs=0.0,
                       lr_decay="none", checkpoint_every="0", progress="never",
                       bucket_mb=100 / 2**20)
