"""``hpctrain-horovodrun``: Horovod's ``horovodrun`` command line, for jobs on hpctrain.

A Horovod job script changes one word::

    horovodrun -np 8 -H host1:4,host2:4 python train.py            # Horovod
    hpctrain-horovodrun -np 8 -H host1:4,host2:4 python train.py   # the same job on hpctrain

(also ``python -m hpctrain.launch.horovodrun``). The name is its own, so that it never
shadows Horovod's ``horovodrun`` where both are installed.

The ranks are started by ``mpirun``, with the flags of :func:`hpctrain.launch.mpirun_command`,
``--map-by slot`` (each host's ranks consecutive, as horovodrun asks) and the hosts of ``-H`` or
``--hostfile``; or, inside a Slurm allocation (``SLURM_JOB_ID``) when no hosts are named, by
``srun --mpi=pmix --kill-on-bad-exit=1``. ``HPCTRAIN_LAUNCHER=mpirun`` or ``srun`` chooses
(as for the job scripts in ``jobs/``).

Horovod's tuning options reach the ranks the way horovodrun hands them over: as ``HOROVOD_*``
environment variables with Horovod 0.28.1's names and units (:data:`SETTINGS`,
:data:`SWITCHES`), each also given to mpirun as ``-x NAME=VALUE`` so that ranks on other hosts
get it (srun hands every task the whole environment). With hosts named, every other variable
of the launch environment is exported to the ranks too, as horovodrun does, except those that
describe this host or this process (:func:`exported`). Whether the ranks follow a setting is
``hpctrain.torch``'s business: the launcher only sets it.

The ranks' output passes through :mod:`hpctrain.launch.output`: every line tagged with its
rank as horovodrun tags them, ``[RANK]<stdout>:`` (``--no-tag-output``: bare), and after a
failed job one root-cause block (the first rank to fail, its host, exit status or signal,
its error). The exit status is mpirun's (srun's).

Options that belong to Horovod's own machinery (Gloo, jsrun, its checks of the hosts and their
cache, elastic mode, a YAML configuration) are refused with what to do instead
(:data:`REFUSED`); those that only mpirun can apply (``--mpi-args``, ``-p``, ...) are refused
under srun. Bad input (an unknown option, a value that does not parse, a malformed host, fewer
slots than ``-np``, no command) is one message with a valid example and exit status 2, before
anything starts.
"""

import dataclasses
import difflib
import os
import re
import shlex
import shutil
import sys
import textwrap

from .. import __version__
from ..errors import UsageError
from ..log import LEVELS
from ..options import by_flag, checked_value, example, help_lines, option, spelling
from . import PROGRESS_TTY, find_mpirun, launch_environment, mpirun_command, output
from . import srun_command
from .hosts import given_hosts, host_list, total_slots

NAME = "hpctrain-horovodrun"
EXAMPLE = f"{NAME} -np 8 -H host1:4,host2:4 python train.py"
#: Chooses the launcher as in ``jobs/``: ``mpirun`` or ``srun`` (default: srun inside a Slurm
#: allocation when no hosts are named, mpirun otherwise).
LAUNCHER = "HPCTRAIN_LAUNCHER"
MIB = 1 << 20
#: The log level ``--verbose`` asks of the ranks where ``--log-level`` gives none.
VERBOSE_LOG_LEVEL = "DEBUG"


def _log_level(text):
    if text.lower() not in LEVELS:
        raise ValueError(f"give one of {', '.join(name.upper() for name in LEVELS)}")
    return text.upper()


def _path(text):
    if not text:
        raise ValueError("give a file name")
    return text


def _switch(variable, on, off, help):
    # A Horovod on/off option: ``on`` spellings export ``variable``=1, ``off`` ones =0.
    return option(None, help, flags=on, off=off, flag=True, env=variable)


@dataclasses.dataclass
class Tuning:
    """Horovod's tuning options: each a field whose ``env`` is the ``HOROVOD_*`` variable
    that carries it to the ranks, with Horovod 0.28.1's names and units. The launch
    environment's own value reaches the ranks where no option is given (the environment <
    the command line)."""

    fusion_threshold_mb: int = option(None, "fusion buffer in MiB (exported in bytes)",
                                      env="HOROVOD_FUSION_THRESHOLD", minimum=0, example=32)
    cycle_time_ms: float = option(None, "milliseconds between negotiations",
                                  env="HOROVOD_CYCLE_TIME", minimum=0, unit="milliseconds",
                                  example=5)
    cache_capacity: int = option(None, "operations the response cache numbers",
                                 env="HOROVOD_CACHE_CAPACITY", minimum=0, example=1024)
    timeline_filename: str = option(None, "rank 0's timeline", env="HOROVOD_TIMELINE",
                                    parse=_path, example="timeline.json")
    stall_check_warning_time_seconds: int = option(
        None, "seconds before a stall warning", env="HOROVOD_STALL_CHECK_TIME_SECONDS",
        minimum=0, example=60)
    stall_check_shutdown_time_seconds: int = option(
        None, "seconds of a stall before shutdown", env="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
        minimum=0, example=0)
    log_level: str = option(None, "the ranks' log level", env="HOROVOD_LOG_LEVEL",
                            parse=_log_level, example="INFO")
    autotune_log_file: str = option(None, "the autotuner's log", env="HOROVOD_AUTOTUNE_LOG",
                                    parse=_path, example="autotune.csv")
    autotune_warmup_samples: int = option(None, "autotuner warm-up samples",
                                          env="HOROVOD_AUTOTUNE_WARMUP_SAMPLES", minimum=0,
                                          example=3)
    autotune_steps_per_sample: int = option(None, "autotuner steps per sample",
                                            env="HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
                                            minimum=0, example=10)
    autotune_bayes_opt_max_samples: int = option(
        None, "autotuner samples", env="HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", minimum=0,
        example=20)
    autotune_gaussian_process_noise: float = option(
        None, "autotuner noise", env="HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", minimum=0,
        maximum=1, example=0.8)
    num_nccl_streams: int = option(None, "NCCL streams", env="HOROVOD_NUM_NCCL_STREAMS",
                                   minimum=0, example=1)
    thread_affinity: int = option(None, "the background thread's core",
                                  env="HOROVOD_THREAD_AFFINITY", minimum=0, example=0)
    gloo_timeout_seconds: int = option(None, "Gloo's timeout",
                                       env="HOROVOD_GLOO_TIMEOUT_SECONDS", minimum=0,
                                       example=30)
    hierarchical_allreduce: bool = _switch(
        "HOROVOD_HIERARCHICAL_ALLREDUCE", ("--hierarchical-allreduce",),
        ("--no-hierarchical-allreduce",), "hierarchical allreduce")
    hierarchical_allgather: bool = _switch(
        "HOROVOD_HIERARCHICAL_ALLGATHER", ("--hierarchical-allgather",),
        ("--no-hierarchical-allgather",), "hierarchical allgather")
    torus_allreduce: bool = _switch("HOROVOD_TORUS_ALLREDUCE", ("--torus-allreduce",),
                                    ("--no-torus-allreduce",), "torus allreduce")
    timeline_mark_cycles: bool = _switch(
        "HOROVOD_TIMELINE_MARK_CYCLES", ("--timeline-mark-cycles",),
        ("--no-timeline-mark-cycles",), "the timeline marks each negotiation")
    autotune: bool = _switch("HOROVOD_AUTOTUNE", ("--autotune",), ("--no-autotune",),
                             "the autotuner")
    stall_check_disable: bool = _switch("HOROVOD_STALL_CHECK_DISABLE", ("--no-stall-check",),
                                        ("--stall-check",), "no stall warnings")
    mpi_threads_disable: bool = _switch(
        "HOROVOD_MPI_THREADS_DISABLE", ("--mpi-threads-disable",),
        ("--no-mpi-threads-disable",), "MPI without threads")
    log_hide_time: bool = _switch(
        "HOROVOD_LOG_HIDE_TIME", ("--log-without-timestamp", "--log-hide-timestamp"),
        ("--log-with-timestamp", "--no-log-hide-timestamp"), "log lines without time")
    tcp: bool = _switch("NCCL_IB_DISABLE", ("--tcp",), (), "NCCL over TCP, not InfiniBand")


def _exported(f, value):
    """Field ``f``'s ``value`` as Horovod's runner writes its variable."""
    if f.type is bool:
        return "1" if value else "0"
    if f.name == "fusion_threshold_mb":
        return str(value * MIB)
    return str(value)


#: Horovod's tuning options that take a value: option -> (variable, field of :class:`Tuning`).
SETTINGS = {spelling(f): (f.metadata["env"], f) for f in dataclasses.fields(Tuning)
            if f.type is not bool}
#: Horovod's on/off options: option -> (variable, value).
SWITCHES = {flag: (f.metadata["env"], "1" if flag in f.metadata["flags"] else "0")
            for f in dataclasses.fields(Tuning) if f.type is bool
            for flag in (*f.metadata["flags"], *f.metadata["off"])}

#: Settings that horovodrun exports only beside another one that is on: the cycle marks with
#: a timeline, the autotuner's parameters with the autotuner.
NEEDS = {
    "HOROVOD_TIMELINE_MARK_CYCLES": "HOROVOD_TIMELINE",
    **{variable: "HOROVOD_AUTOTUNE" for flag, (variable, _) in SETTINGS.items()
       if flag.startswith("--autotune-")},
}

_ELASTIC = ("elastic training is `python -m hpctrain.launch --elastic` (docs/elastic.md), "
            "which takes --min-np, --max-np and --host-discovery-script")
_NO_CHECKS = (f"{NAME} runs no checks of the hosts before mpirun, so there is nothing to "
              "time out or cache: drop it (mpirun itself reports a host it cannot reach)")

#: Options of horovodrun that cannot apply here: option -> what to do instead.
REFUSED = {
    "--gloo": "hpctrain runs on MPI only: drop --gloo (the ranks use the MPI of mpirun/srun)",
    "--jsrun": "start the ranks with jsrun yourself (jsrun -n N python train.py): "
               "hpctrain.torch starts under any MPI launcher",
    "-cb": "`mpirun -np 1 python -m hpctrain info` lists the frameworks and controllers",
    "--check-build": "`mpirun -np 1 python -m hpctrain info` lists the frameworks and "
                     "controllers",
    "--config-file": "give each setting of the file as its option "
                     "(params: fusion_threshold_mb: 32 is --fusion-threshold-mb 32)",
    "--start-timeout": _NO_CHECKS,
    "--disable-cache": _NO_CHECKS,
    **dict.fromkeys(("--min-np", "--min-num-proc", "--max-np", "--max-num-proc",
                     "--slots-per-host", "--elastic-timeout", "--reset-limit",
                     "--blacklist-cooldown-range", "--host-discovery-script"), _ELASTIC),
}

#: Variables of the launch environment not exported to the ranks on other hosts: they
#: describe this host (its name, GPUs, working directory, shell) or this process's place in
#: a Slurm allocation or an MPI job, which a rank elsewhere must learn from its own.
LOCAL_NAMES = {"HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_"}
LOCAL_PREFIXES = ("BASH_FUNC_", "SLURM_", "PMI_")
LOCAL_SUFFIXES = ("_VISIBLE_DEVICES",)


def _words(text):
    # Words for mpirun, as the shell would split them.
    return shlex.split(text)


def _nics(text):
    return text.split(",")


@dataclasses.dataclass
class Options:
    """What the command line gave: the launch's options, each a field with its spellings
    (Horovod's first), range and help; ``settings``: the :class:`Tuning` options given, as
    the variables the ranks get. Checked by :func:`parse_options`."""

    command: list = dataclasses.field(default_factory=list)
    np: int = option(None, "number of ranks (in a Slurm allocation: SLURM_NTASKS)",
                     flags=("-np", "--num-proc"), minimum=1, metavar="N", example=8)
    hosts: str = option(None, "hosts and their slots (HOST alone: 1 slot)",
                        flags=("-H", "--hosts"), metavar="H:S,...", example="host1:4,host2:4")
    hostfile: str = option(None, "one `HOST slots=N` per line",
                           flags=("--hostfile", "-hostfile"), parse=_path, metavar="FILE",
                           example="hosts.txt")
    mpi_args: list = option([], "more mpirun options (last, so they win)",
                            flags=("--mpi-args",), parse=_words, metavar='"ARGS"',
                            example='"--mca btl tcp,self"')
    binding_args: list = option([], "mpirun's binding (default --bind-to none --map-by slot)",
                                flags=("--binding-args",), parse=_words, metavar='"ARGS"',
                                example='"--bind-to core"')
    output_filename: str = option(None, "mpirun --output-filename DIR",
                                  flags=("--output-filename",), parse=_path, metavar="DIR",
                                  example="logs")
    timestamp: bool = option(False, "mpirun --timestamp-output",
                             flags=("--prefix-output-with-timestamp", "-prefix-timestamp"),
                             flag=True)
    ssh_port: int = option(None, 'mpirun --mca plm_rsh_args "-p P"',
                           flags=("-p", "--ssh-port"), minimum=1, metavar="P", example=22)
    ssh_identity: str = option(None, 'mpirun --mca plm_rsh_args "-i F"',
                               flags=("-i", "--ssh-identity-file"), parse=_path, metavar="F",
                               example="~/.ssh/id_rsa")
    interfaces: list = option([], "OMPI_MCA_btl_tcp_if_include and NCCL_SOCKET_IFNAME",
                              flags=("--network-interfaces", "--network-interface"),
                              parse=_nics, metavar="NICS", example="eth0")
    tag: bool = option(True, "--no-tag-output: the ranks' lines as they wrote them (default: "
                             "tagged [RANK]<stdout>: and [RANK]<stderr>:, as horovodrun "
                             "does)",
                       flags=("--tag-output",), off=("--no-tag-output",), flag=True)
    verbose: bool = option(False, f"print the launch line; HOROVOD_LOG_LEVEL="
                                  f"{VERBOSE_LOG_LEVEL}", flags=("--verbose",), flag=True)
    mpi: bool = option(False, "accepted (MPI is the only controller)", flags=("--mpi",),
                       flag=True)
    help: bool = option(False, "this text", flags=("-h", "--help"), flag=True)
    version: bool = option(False, "the version", flags=("-v", "--version"), flag=True)
    settings: dict = dataclasses.field(default_factory=dict)    # variable -> value
    mpirun_only: list = dataclasses.field(default_factory=list)  # such options given


#: Fields of :class:`Options` that only mpirun can apply.
MPIRUN_ONLY = ("mpi_args", "binding_args", "output_filename", "timestamp", "ssh_port",
               "ssh_identity")
#: Every option: spelling -> field of :class:`Options` or :class:`Tuning`.
LAUNCH, TUNING = by_flag(Options), {**{o: f for o, (_, f) in SETTINGS.items()},
                                    **by_flag(Tuning)}


@dataclasses.dataclass
class Launch:
    """The launch that the options make: ``argv`` (``mpirun`` or ``srun`` first, by name) to
    run with the environment ``env``; ``settings``: what the ranks are told."""

    argv: list
    env: dict
    settings: dict


def parse_options(argv):
    """:class:`Options` from a horovodrun command line; ``UsageError`` naming the option for
    an unknown or refused one, a value that does not parse, or no command."""
    options, words = Options(), list(argv)
    while words and words[0].startswith("-") and words[0] != "-":
        word = words.pop(0)
        if word == "--":
            break
        name, eq, text = word.partition("=")
        if name in REFUSED:
            raise UsageError(f"{name} does not apply to {NAME}: {REFUSED[name]}")
        f = LAUNCH.get(name) or TUNING.get(name)
        if f is None:
            raise UsageError(_unknown(name))
        if f.type is bool:
            if eq:
                raise UsageError(f"{name} takes no value (got {word!r})")
            _store(options, f, name not in f.metadata["off"])
            continue
        if not eq:
            if not words:
                raise UsageError(f"{name} needs a value; e.g. {example(f)}")
            text = words.pop(0)
        _store(options, f, checked_value(f, text, name))
    options.command = words
    if not (options.help or options.version):
        _check(options)
    return options


def _unknown(name):
    close = difflib.get_close_matches(name, [*LAUNCH, *TUNING], n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown option {name}{hint}"


def _store(options, f, value):
    """Keep option ``f``'s ``value``: a tuning option as its variable, a list's words added
    (``--binding-args``: the last one given), anything else as its field."""
    if f.metadata["env"]:
        options.settings[f.metadata["env"]] = _exported(f, value)
        return
    if f.name in MPIRUN_ONLY:
        options.mpirun_only.append(f.metadata["flags"][0])
    if f.name in ("mpi_args", "interfaces"):
        old = getattr(options, f.name)
        value = old + [word for word in value if f.name == "mpi_args" or word not in old]
    setattr(options, f.name, value)


def _check(options):
    if not options.command:
        raise UsageError("no command to launch: give it after the options")
    if options.hosts is not None and options.hostfile is not None:
        raise UsageError("-H and --hostfile: give the hosts one way only")
    if "" in options.interfaces:
        raise UsageError("--network-interfaces: an empty interface name")


def read_hosts(options):
    """``[(host, slots), ...]`` from ``-H`` or ``--hostfile``; ``None`` when neither is given."""
    return given_hosts(options.hosts, options.hostfile)


def choose_launcher(options, environ):
    """``"mpirun"`` or ``"srun"``: ``$HPCTRAIN_LAUNCHER`` if set, else srun inside a Slurm
    allocation when no hosts are named, else mpirun; ``UsageError`` for a choice that cannot
    work."""
    named = options.hosts is not None or options.hostfile is not None
    choice = environ.get(LAUNCHER) or \
        ("srun" if "SLURM_JOB_ID" in environ and not named else "mpirun")
    if choice not in ("mpirun", "srun"):
        raise UsageError(f"{LAUNCHER} must be mpirun or srun, got {choice!r}")
    if choice == "srun":
        if "SLURM_JOB_ID" not in environ:
            raise UsageError(f"{LAUNCHER}=srun needs a Slurm allocation (salloc or sbatch)")
        if named:
            raise UsageError("srun takes its hosts from the Slurm allocation: drop -H/--hostfile, "
                             f"or set {LAUNCHER}=mpirun")
        if options.mpirun_only:
            option = options.mpirun_only[0]
            raise UsageError(f"{option} is for mpirun, and inside this Slurm allocation the "
                             f"ranks are started by srun: drop {option}, or set "
                             f"{LAUNCHER}=mpirun to start them with mpirun")
    return choice


def world_size(options, environ, launcher):
    """The number of ranks: ``-np``, else the allocation's ``SLURM_NTASKS``; ``UsageError``
    when neither says, or when srun is asked for more tasks than the allocation has."""
    tasks = environ.get("SLURM_NTASKS", "")
    tasks = int(tasks) if "SLURM_JOB_ID" in environ and tasks.isdigit() else None
    np = options.np if options.np is not None else tasks
    if np is None:
        raise UsageError(f"-np N is required (the number of ranks), e.g. {EXAMPLE}")
    if launcher == "srun" and tasks is not None and np > tasks:
        raise UsageError(f"-np {np}, but this Slurm allocation has {tasks} tasks "
                         f"(SLURM_NTASKS): start at most {tasks} ranks, or ask sbatch/salloc "
                         f"for more")
    return np


def rank_settings(options):
    """The variables the ranks get: the options' settings, ``HOROVOD_LOG_LEVEL`` for
    ``--verbose``, the network interfaces (Open MPI's TCP transport, NCCL's sockets), less
    those that horovodrun exports only beside a setting that is not on."""
    settings = dict(options.settings)
    if options.verbose:
        settings.setdefault("HOROVOD_LOG_LEVEL", VERBOSE_LOG_LEVEL)
    if options.interfaces:
        nics = ",".join(options.interfaces)
        settings.update(OMPI_MCA_btl_tcp_if_include=nics, NCCL_SOCKET_IFNAME=nics)
    return {name: value for name, value in settings.items()
            if name not in NEEDS or settings.get(NEEDS[name], "0") not in ("", "0")}


def exported(environ):
    """The names in ``environ`` that a rank on another host should get as they are here:
    every variable but those of :data:`LOCAL_NAMES`, ``LOCAL_PREFIXES``, ``LOCAL_SUFFIXES``."""
    return sorted(name for name in environ
                  if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
                  and name not in LOCAL_NAMES and not name.startswith(LOCAL_PREFIXES)
                  and not name.endswith(LOCAL_SUFFIXES))


def mpirun_words(options):
    """The words that the options give to mpirun alone, in an order where the user's own
    (``--binding-args``, then ``--mpi-args``) come last: mpirun takes the last of repeated
    options, so they override the launcher's defaults (``--bind-to none``, ``--map-by slot``)."""
    words = []
    ssh = [*(["-p", str(options.ssh_port)] if options.ssh_port else []),
           *(["-i", options.ssh_identity] if options.ssh_identity else [])]
    if ssh:
        words += ["--mca", "plm_rsh_args", shlex.join(ssh)]
    if options.output_filename:
        words += ["--output-filename", options.output_filename]
    if options.timestamp:
        words.append("--timestamp-output")
    return [*words, *options.binding_args, *options.mpi_args]


def plan(options, environ, *, tty=False):
    """The :class:`Launch` that ``options`` make in the environment ``environ``; ``tty``: the
    launcher's output is a terminal. ``UsageError`` for bad input; nothing is started."""
    launcher = choose_launcher(options, environ)
    hosts = read_hosts(options)
    np = world_size(options, environ, launcher)
    if hosts is not None and total_slots(hosts) < np:
        given = f"-H {options.hosts}" if options.hostfile is None \
            else f"--hostfile {options.hostfile} ({host_list(hosts)})"
        raise UsageError(f"-np {np}, but {given} has {total_slots(hosts)} slot(s): name more "
                         f"hosts or slots, or start at most {total_slots(hosts)} ranks")
    settings = rank_settings(options)
    env = {**launch_environment(environ), **settings}
    if launcher == "srun":
        if tty:
            env[PROGRESS_TTY] = "1"
        argv = srun_command(np, options.command, environ)
        return Launch(argv, env, settings)
    extra = ["--map-by", "slot"]
    if hosts is not None:
        extra += ["-H", host_list(hosts)]
    extra += [word for name in sorted(settings) for word in ("-x", f"{name}={settings[name]}")]
    if hosts is not None:
        # mpirun hands the ranks on other hosts only what -x names; horovodrun names all.
        extra += [word for name in exported(env) if name not in settings
                  for word in ("-x", name)]
    extra += mpirun_words(options)
    return Launch(mpirun_command(np, options.command, extra=extra, tty=tty), env, settings)


def _switches_by_variable():
    """``{variable: ([option, ...], [value, ...])}`` of :data:`SWITCHES`, for ``--help``."""
    grouped = {}
    for flag, (variable, value) in SWITCHES.items():
        spellings, values = grouped.setdefault(variable, ([], []))
        spellings.append(flag)
        if value not in values:
            values.append(value)
    return grouped


USAGE = f"""\
usage: {NAME} -np N [-H HOST:SLOTS,... | --hostfile FILE] [OPTIONS] COMMAND...

Horovod's horovodrun for hpctrain: `horovodrun ...` becomes `{NAME} ...`, e.g.
    {EXAMPLE}

The ranks are started by mpirun, or by srun inside a Slurm allocation when no hosts are
named ({LAUNCHER}=mpirun|srun chooses).

launch:
""" + help_lines(Options) + """
settings for the ranks (exported with mpirun -x, as horovodrun does):
""" + "".join(f"  {option:<37} {variable}{' (bytes)' if option.endswith('-mb') else ''}\n"
              for option, (variable, _) in SETTINGS.items()) + \
    "\nswitches for the ranks (the same way):\n" + \
    "".join(f"  {variable + '=' + '|'.join(values):<37} {', '.join(spellings)}\n"
            for variable, (spellings, values) in _switches_by_variable().items()) + \
    "\n" + textwrap.fill(f"refused, each with what to do instead: {' '.join(REFUSED)}",
                         width=92, break_on_hyphens=False) + "\n"


def _program(name):
    """The path of ``name`` (``mpirun`` or ``srun``); ``FileNotFoundError`` saying so."""
    if name == "mpirun":
        return find_mpirun()
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(f"{name} not found on PATH, though SLURM_JOB_ID is set")
    return path


def with_this_python(environ):
    """``environ`` with this interpreter's ``bin`` folder first on ``PATH`` when it runs in a
    virtual environment, as activating it would: ``python train.py`` in the command is then
    the Python that has hpctrain (``.venv/bin/hpctrain-horovodrun`` works unactivated)."""
    if sys.prefix == sys.base_prefix:
        return environ
    folder = os.path.join(sys.prefix, "bin")
    path = environ.get("PATH", "")
    if path.split(os.pathsep)[:1] == [folder]:
        return environ
    return {**environ, "PATH": os.pathsep.join(p for p in (folder, path) if p)}


def main(argv=None):
    """``hpctrain-horovodrun [OPTIONS] COMMAND...``: run mpirun (or srun) with the ranks'
    settings, their output tagged by rank (:func:`hpctrain.launch.output.run`: a root-cause
    block when the job fails); return its exit status. Bad input is one message and exit
    status 2, with nothing started."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        options = parse_options(argv)
        if options.help or options.version:
            print(USAGE if options.help else f"{NAME} (hpctrain {__version__})\n", end="")
            return 0
        launch = plan(options, with_this_python(os.environ), tty=sys.stdout.isatty())
        program = _program(launch.argv[0])
    except UsageError as exc:
        print(f"{NAME}: error: {exc}\n  e.g. {EXAMPLE}   ({NAME} --help lists every option)",
              file=sys.stderr)
        return exc.exit_code
    except FileNotFoundError as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return 1
    argv = [program, *launch.argv[1:]]
    if options.verbose:
        print(f"[{NAME}] {shlex.join(output.labelled(argv))}", file=sys.stderr, flush=True)
    return output.run(argv, launch.env, tag=options.tag, name=NAME)


if __name__ == "__main__":
    sys.exit(main())
