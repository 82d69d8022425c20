"""The engine's settings, read once by ``init``: hpctrain's own variables and Horovod's.

A Horovod job sets ``HOROVOD_*`` variables (or ``horovodrun`` sets them from its options).
Each of Horovod 0.28.1's runtime variables that concerns ``horovod.torch`` is, here, one of:

- **honoured**: the same meaning (``HOROVOD_TIMELINE``, ``HOROVOD_CYCLE_TIME``, the stall
  checks, the response cache's capacity, the log level);
- **mapped**: onto the setting of ours that does that job (``HOROVOD_FUSION_THRESHOLD`` is
  the ``DistributedOptimizer``'s default bucket size, ``HOROVOD_HIERARCHICAL_ALLREDUCE=1``
  the ``hierarchical`` algorithm);
- **ignored**: it tunes a part hpctrain does not have (NCCL streams, Gloo, the autotuner);
  rank 0 says so once, at ``init``, naming each one that is set.

:data:`HOROVOD_VARIABLES` is that table; ``docs/torch.md`` prints it. Where an hpctrain
variable and its Horovod twin are both set, hpctrain's wins (it is the more specific).
A value that does not parse is a :class:`~hpctrain.errors.UsageError` naming the variable
and a valid example, raised by ``init`` before any collective: every rank reads the same
environment, so every rank stops alike (status 2).

Under ``HPCTRAIN_ALLREDUCE=horovod`` the real Horovod reads its own variables; none of this
applies.
"""

import os
from dataclasses import dataclass

from .. import startup, units
from ..errors import UsageError

@dataclass(frozen=True)
class Settings:
    """What the engine and ``init`` take from the environment (the defaults are Horovod's)."""

    cycle_s: float = 0.001              # seconds between negotiations
    stall_check_s: float = 60.0         # rank 0 names the missing ranks after this (0: off)
    stall_shutdown_s: float = 0.0       # every rank shuts down after this stall (0: never)
    deadlock_s: float = 2.0             # all blocked on names others never ask: all fail
    start_timeout_s: object = None      # waits in start-up, in all (None: scaled to np; 0: off)
    cache_capacity: int = 1024          # operations the response cache numbers (0: none)
    fusion_bytes: object = None         # DistributedOptimizer's default bucket (None: ours)
    timeline: object = None             # a path: rank 0 records a timeline from init
    mark_cycles: bool = False           # the timeline marks each negotiation
    hierarchical: bool = False          # the default algorithm is ``hierarchical``
    ignored: tuple = ()                 # (variable, why) of each ignored one that is set


def _boolean(name, value):
    word = value.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off", ""):
        return False
    raise UsageError(f"{name}={value!r} is not a boolean: give 1 or 0, e.g. {name}=1")


def _number(name, value, kind, example):
    try:
        return units.number(value, kind, minimum=0)
    except ValueError as exc:
        raise UsageError(f"{name}={value!r} is not {exc}: e.g. {name}={example}") from None


#: Horovod 0.28.1's runtime variables that concern ``horovod.torch``: what hpctrain does with
#: each (``honoured``, ``mapped`` or ``ignored``) and how. The first column of docs/torch.md's
#: table; ``read`` implements the first two kinds.
HOROVOD_VARIABLES = {
    "HOROVOD_TIMELINE": ("honoured", "rank 0 records a timeline from `init` into the file "
                         "(`DYNAMIC`: only once `hvd.start_timeline` is called)"),
    "HOROVOD_TIMELINE_MARK_CYCLES": ("honoured", "`CYCLE_START` marks each negotiation"),
    "HOROVOD_CYCLE_TIME": ("honoured", "milliseconds between negotiations "
                           "(hpctrain's `HPCTRAIN_CYCLE_TIME_MS`)"),
    "HOROVOD_CACHE_CAPACITY": ("honoured", "operations the response cache numbers; 0 turns "
                               "it off"),
    "HOROVOD_STALL_CHECK_DISABLE": ("honoured", "1: no stall warnings"),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ("honoured", "seconds before rank 0 names the ranks "
                                         "an operation waits for (`HPCTRAIN_STALL_CHECK_S`)"),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": ("honoured", "seconds of stall after which every "
                                            "rank shuts down, alike (0: never)"),
    "HOROVOD_LOG_LEVEL": ("honoured", "the level of the `hpctrain` logger, where "
                          "`HPCTRAIN_LOG_LEVEL` is not set (trace is debug, fatal critical)"),
    "HOROVOD_DYNAMIC_PROCESS_SETS": ("honoured", "nothing to do: sets may always be added "
                                     "and removed"),
    "HOROVOD_ELASTIC": ("honoured", "nothing to do: `hvd.elastic.run` works with or without "
                        "it"),
    "HOROVOD_FUSION_THRESHOLD": ("mapped", "bytes: the default bucket size of "
                                 "`DistributedOptimizer` (`bucket_mb`), which is where "
                                 "hpctrain fuses; 0: one gradient per bucket"),
    "HOROVOD_HIERARCHICAL_ALLREDUCE": ("mapped", "1: the `hierarchical` algorithm, unless "
                                       "`init(allreduce=)` or `HPCTRAIN_ALLREDUCE` names one"),
    "HOROVOD_HIERARCHICAL_ALLGATHER": ("ignored", "the allgather goes with the allreduce "
                                       "algorithm (`collectives.companion`)"),
    "HOROVOD_TORUS_ALLREDUCE": ("ignored", "no torus algorithm; `hierarchical` is the two-level "
                                "one"),
    "HOROVOD_AUTOTUNE": ("ignored", "no run-time tuner; `HPCTRAIN_ALLREDUCE=auto` picks an "
                         "algorithm per size from a measured profile"),
    "HOROVOD_AUTOTUNE_LOG": ("ignored", "no run-time tuner"),
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": ("ignored", "no run-time tuner"),
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": ("ignored", "no run-time tuner"),
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": ("ignored", "no run-time tuner"),
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": ("ignored", "no run-time tuner"),
    "HOROVOD_MPI_THREADS_DISABLE": ("ignored", "the engine's thread calls MPI beside the "
                                    "caller's, so `init` asks for `MPI_THREAD_MULTIPLE`"),
    "HOROVOD_CONTROLLER": ("ignored", "the controller is MPI"),
    "HOROVOD_CPU_OPERATIONS": ("ignored", "CPU tensors go through MPI (no Gloo or oneCCL)"),
    "HOROVOD_CCL_CACHE": ("ignored", "no oneCCL"),
    "HOROVOD_GLOO_IFACE": ("ignored", "no Gloo"),
    "HOROVOD_GLOO_TIMEOUT_SECONDS": ("ignored", "no Gloo"),
    "HOROVOD_NUM_NCCL_STREAMS": ("ignored", "no NCCL: device buffers go to a CUDA-aware MPI "
                                 "on the engine's own stream"),
    "HOROVOD_BATCH_D2D_MEMCOPIES": ("ignored", "no fusion-buffer kernels"),
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE": ("ignored", "Adasum sends each vector whole"),
    "HOROVOD_THREAD_AFFINITY": ("ignored", "the engine's thread is not pinned"),
    "HOROVOD_DISABLE_GROUP_FUSION": ("ignored", "grouped allreduces are always fused"),
    "HOROVOD_DISABLE_NVTX_RANGES": ("ignored", "no NVTX ranges"),
    "HOROVOD_ENABLE_ASYNC_COMPLETION": ("ignored", "a handle completes when its collective "
                                        "has, on every device"),
    "HOROVOD_LOG_HIDE_TIME": ("ignored", "log records carry the `logging` format"),
}


def _seconds_of_ms(name, value):
    return _number(name, value, float, "1") / 1000


def _count(example):
    return lambda name, value: _number(name, value, int, example)


def _seconds(example):
    return lambda name, value: _number(name, value, float, example)


#: ``(field of Settings, hpctrain's variable, Horovod's, parse(name, value))``: the first of the
#: two that is set gives the field.
VALUES = (
    ("cycle_s", "HPCTRAIN_CYCLE_TIME_MS", "HOROVOD_CYCLE_TIME", _seconds_of_ms),
    ("stall_check_s", "HPCTRAIN_STALL_CHECK_S", "HOROVOD_STALL_CHECK_TIME_SECONDS",
     _seconds("60")),
    ("stall_shutdown_s", None, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", _seconds("120")),
    ("deadlock_s", "HPCTRAIN_DEADLOCK_S", None, _seconds("2")),
    ("start_timeout_s", startup.VARIABLE, None, _seconds("300")),
    ("cache_capacity", None, "HOROVOD_CACHE_CAPACITY", _count("1024")),
    ("fusion_bytes", None, "HOROVOD_FUSION_THRESHOLD", _count(str(64 * 2**20))),
    ("timeline", None, "HOROVOD_TIMELINE", lambda name, value: value),
    ("mark_cycles", None, "HOROVOD_TIMELINE_MARK_CYCLES", _boolean),
    ("hierarchical", None, "HOROVOD_HIERARCHICAL_ALLREDUCE", _boolean),
)
#: Values of ignored variables that ask for what hpctrain does anyway: not worth a warning.
AS_HERE = {"HOROVOD_CPU_OPERATIONS": "mpi", "HOROVOD_CONTROLLER": "mpi"}


def read(environ=None):
    """The :class:`Settings` of ``environ`` (default ``os.environ``); ``UsageError`` naming
    the variable and a valid example for a value that does not parse. (The log level is
    :mod:`hpctrain.log`'s, read when the logger is set up.)"""
    env = os.environ if environ is None else environ
    found = {}
    for field, *names, parse in VALUES:
        name = next((n for n in names if n and env.get(n, "").strip()), None)
        if name:
            found[field] = parse(name, env[name])
    if _boolean("HOROVOD_STALL_CHECK_DISABLE", env.get("HOROVOD_STALL_CHECK_DISABLE", "")):
        found["stall_check_s"] = 0.0
    found["ignored"] = tuple(
        (var, why) for var, (kind, why) in HOROVOD_VARIABLES.items()
        if kind == "ignored" and env.get(var, "").strip() not in ("", "0")
        and env[var].strip().lower() != AS_HERE.get(var))
    return Settings(**found)


def ignored_message(settings):
    """The one warning rank 0 gives at ``init`` for the ignored variables that are set, or
    ``None``."""
    if not settings.ignored:
        return None
    lines = "; ".join(f"{name} ({why})" for name, why in settings.ignored)
    return (f"hpctrain.torch ignores these Horovod settings (docs/torch.md has the table): "
            f"{lines}")
