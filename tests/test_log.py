"""hpctrain's diagnostics through ``logging`` (hpctrain/log.py): the line format, rank 0 by
default, every rank's errors, the level and ranks from the environment, bad values.

Each test sets up a logger of its own the way ``configure`` sets up ``hpctrain``'s (pytest's
own log capture hangs handlers on loggers, so the ``hpctrain`` logger is left alone)."""

import itertools
import logging

import pytest

from hpctrain import log
from hpctrain.errors import UsageError

NUMBERS = itertools.count()


@pytest.fixture
def setup(monkeypatch):
    """``setup(name)``: a fresh logger ``name`` under a test root, set up as hpctrain's."""
    for name in (log.LEVEL_VARIABLE, log.HOROVOD_LEVEL_VARIABLE, log.RANKS_VARIABLE,
                 "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                 "SLURM_PROCID", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    root = f"logtest{next(NUMBERS)}"

    def make(child=""):
        top = logging.getLogger(root)
        if not top.handlers:
            log.setup(top)
        return logging.getLogger(f"{root}.{child}" if child else root), root
    return make


def lines(capsys):
    return capsys.readouterr().err.splitlines()


def test_a_line_names_the_logger_and_the_level_from_warnings_up(setup, capsys):
    elastic, root = setup("elastic")
    top, _ = setup()
    elastic.info("lost 1 rank(s)")
    top.warning("stall: 'x' has waited 3 s")
    top.debug("not shown at the default level")
    assert lines(capsys) == [f"[{root}.elastic] lost 1 rank(s)",
                             f"[{root}] warning: stall: 'x' has waited 3 s"]


def test_only_rank_0_logs_below_error_by_default(setup, capsys, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    monkeypatch.setattr(log, "_rank", lambda: 2)      # whatever MPI this process runs
    top, root = setup()
    top.warning("said by rank 0 alone")
    top.error("every rank's own failure")
    assert lines(capsys) == [f"[{root} rank 2] error: every rank's own failure"]


def test_every_rank_with_its_rank_when_asked(setup, capsys, monkeypatch):
    monkeypatch.setenv(log.RANKS_VARIABLE, "all")
    monkeypatch.setenv(log.LEVEL_VARIABLE, "debug")
    monkeypatch.setattr(log, "_rank", lambda: 1)
    top, root = setup()
    top.debug("detail")
    assert lines(capsys) == [f"[{root} rank 1] detail"]


def test_the_package_logger_is_set_up_once():
    first = log.logger()
    ours = [h for h in first.handlers if isinstance(h, log._Stderr)]
    assert log.logger() is first and len(ours) == 1 and not first.propagate


@pytest.mark.parametrize("name, value", [(log.LEVEL_VARIABLE, "loud"),
                                         (log.HOROVOD_LEVEL_VARIABLE, "loud"),
                                         (log.RANKS_VARIABLE, "some")])
def test_a_bad_value_names_the_variable_and_an_example(setup, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(log, "PROBLEMS", [])
    top, _ = setup()                    # set up with the defaults: import must not fail
    assert top.level == logging.INFO
    with pytest.raises(UsageError, match=rf"{name}='{value}': choose one of .* e\.g\. {name}="):
        log.check()


def test_the_rank_that_logs_is_the_job_worlds_once_set(setup, capsys, monkeypatch):
    monkeypatch.setattr(log._World, "rank", None)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")        # were COMM_WORLD's rank asked
    monkeypatch.setitem(__import__("sys").modules, "mpi4py.MPI", None)
    top, root = setup()
    top.info("not rank 0 of COMM_WORLD")
    log.set_rank(0)                                         # rank 0 of the survivors, say
    top.info("rank 0 of the job's world")
    assert lines(capsys) == [f"[{root}] rank 0 of the job's world"]


def test_horovods_level_where_hpctrains_is_not_set(setup, monkeypatch):
    monkeypatch.setenv(log.HOROVOD_LEVEL_VARIABLE, "TRACE")
    top, _ = setup()
    assert top.level == logging.DEBUG
    monkeypatch.setenv(log.LEVEL_VARIABLE, "error")     # hpctrain's own wins
    other = logging.getLogger(f"logtest{next(NUMBERS)}")
    log.setup(other)
    assert other.level == logging.ERROR
