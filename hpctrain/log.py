"""hpctrain's diagnostics, through ``logging``: warnings, the elastic job's events, a skipped
update. A command's own output (tables, reports, the progress of a study) is printed, not
logged.

    from .log import logger
    LOG = logger("hpctrain.elastic")
    LOG.info("lost 1 rank(s) ...")        # [hpctrain.elastic] lost 1 rank(s) ...
    LOG.warning("stall: ...")             # [hpctrain] warning: stall: ...   (logger "hpctrain")

:func:`logger` gives the logger and, the first time, puts one handler on the ``hpctrain``
logger (unless the application gave it one): standard error, a line per record,
``[NAME] LEVEL: MESSAGE`` with the level named from warnings up, and ``rank R`` after the
name when more than rank 0 logs. By default only rank 0 logs below ``ERROR`` (every rank
runs the same code: one line, not one per rank); errors come from every rank.

- ``HPCTRAIN_LOG_LEVEL``, else Horovod's ``HOROVOD_LOG_LEVEL``: ``trace`` (as ``debug``),
  ``debug``, ``info`` (default), ``warning``, ``error`` or ``fatal`` (as ``critical``);
- ``HPCTRAIN_LOG_RANKS``: ``0`` (default) or ``all``.

A bad value is a :class:`~hpctrain.errors.UsageError` naming it and a valid example, raised
by :func:`check` (``hvd.init`` and every command call it), not at import.
"""

import logging
import os
import sys

from .errors import UsageError
from .runtime import launcher_rank

ROOT = "hpctrain"
LEVEL_VARIABLE = "HPCTRAIN_LOG_LEVEL"
HOROVOD_LEVEL_VARIABLE = "HOROVOD_LOG_LEVEL"
RANKS_VARIABLE = "HPCTRAIN_LOG_RANKS"
#: The level names, Horovod's included (``hpctrain-horovodrun --log-level`` takes them too).
LEVELS = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
          "warning": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL}


class _World:
    """The rank that logs as rank 0 is the job's: ``COMM_WORLD``'s, unless whoever made the
    job's world said otherwise (:func:`set_rank`: ``hvd.init`` over a communicator, the
    survivors of an elastic shrink)."""

    rank = None


def set_rank(rank):
    """This process's rank in the job's world from now on (``None``: ``COMM_WORLD``'s)."""
    _World.rank = rank


def _rank():
    if _World.rank is not None:
        return _World.rank
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank()
    return launcher_rank()


class _Ranks(logging.Filter):
    """Rank 0's records, or every rank's (``all``); errors from every rank either way."""

    def __init__(self, every):
        super().__init__()
        self.every = every

    def filter(self, record):
        record.rank = _rank()
        return self.every or record.rank == 0 or record.levelno >= logging.ERROR


class _Line(logging.Formatter):
    def __init__(self, every):
        super().__init__()
        self.every = every

    def format(self, record):
        where = f" rank {record.rank}" if self.every or record.rank != 0 else ""
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        return f"[{record.name}{where}] {level}{record.getMessage()}"


class _Stderr(logging.StreamHandler):
    """Whatever ``sys.stderr`` is when a record is written (a test may have replaced it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        del value


#: What was wrong with the environment when the logger was set up (at import, where raising
#: would break ``import``): :func:`check` raises it where bad input is reported.
PROBLEMS = []


def _setting(name, choices, default):
    value = os.environ.get(name, "").strip().lower() or default
    if value not in choices:
        PROBLEMS.append(f"{name}={value!r}: choose one of {', '.join(choices)}, e.g. "
                        f"{name}={default}")
        return default
    return value


def check():
    """``UsageError`` for a bad ``HPCTRAIN_LOG_LEVEL`` (``HOROVOD_LOG_LEVEL``) or
    ``HPCTRAIN_LOG_RANKS`` value
    (``hvd.init`` and every command call it); the defaults stood in until then."""
    configure()
    if PROBLEMS:
        raise UsageError(PROBLEMS[0])


def configure():
    """Give the ``hpctrain`` logger its handler, level and rank filter (once; not when the
    application has given it a handler of its own)."""
    root = logging.getLogger(ROOT)
    if root.handlers:
        return root
    setup(root)
    return root


def setup(target):
    """Give the logger ``target`` hpctrain's handler and the level of the environment."""
    every = _setting(RANKS_VARIABLE, ("0", "all"), "0") == "all"
    handler = _Stderr()
    handler.addFilter(_Ranks(every))
    handler.setFormatter(_Line(every))
    target.addHandler(handler)
    level = LEVEL_VARIABLE if os.environ.get(LEVEL_VARIABLE, "").strip() \
        else HOROVOD_LEVEL_VARIABLE
    target.setLevel(LEVELS[_setting(level, tuple(LEVELS), "info")])
    target.propagate = False


def logger(name=ROOT):
    """The logger ``name`` (under ``hpctrain``), with the handler configured."""
    configure()
    return logging.getLogger(name)
