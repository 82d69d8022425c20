"""The training configuration: one typed dataclass, a TOML file and command-line overrides.

Precedence: the defaults below < the environment (``HPCTRAIN_ALLREDUCE``,
``HPCTRAIN_ALLREDUCE_PROFILE``: the variables ``hpctrain.torch`` reads too, so that one launch
line chooses for both) < ``--config FILE`` (TOML, flat ``key = value``) < ``--key=value`` /
``--key value`` on the command line. Keys may be spelled with ``-`` or
``_``. An unknown key or an invalid value raises ``UsageError`` naming the valid keys or
values; this happens on every rank, from the same input, before any collective, so a bad
option ends every rank alike instead of leaving some waiting for the others.

The defaults train the digits MLP; ``configs/digits.toml`` spells them out.
"""

import dataclasses
import json
import re
from dataclasses import dataclass, fields
from pathlib import Path

from .. import options, plugins, units
from ..collectives import ALGORITHMS, DEFAULT_ALLREDUCE, ENV_ALLREDUCE, auto
from ..errors import UsageError
from ..log import logger
from ..models import MODELS

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

LOG = logger()

#: The --allreduce names: the collectives' registry (each algorithm registers itself), and
#: auto, which picks one of them per bucket size.
ALLREDUCE = (*ALGORITHMS, "auto")
#: The --regime names, each with the class that runs it (``module.Class`` of this package,
#: which :func:`.build.make_regime` imports: a configuration is checked before torch loads).
REGIMES = {"allreduce": "regimes.AllreduceRegime", "server": "regimes.ServerRegime",
           "sharded-server": "regimes.ShardedServerRegime",
           "async-server": "async_server.AsyncServerRegime"}
#: The regimes' old names, still read, with a warning, from command lines, files and the
#: configurations and checkpoints that runs recorded: ``ps`` and ``ps-sharded`` also name
#: allreduce algorithms (``--allreduce ps``), which are another thing.
RENAMED_REGIMES = {"ps": "server", "ps-sharded": "sharded-server", "async-ps": "async-server"}
OPTIMIZERS = ("sgd", "adam")
DEVICES = ("cpu", "cuda")
LR_SCALING = ("none", "linear")
LR_DECAY = ("none", "cosine")
PROGRESS = ("auto", "always", "never")
NONFINITE = ("error", "skip")


#: A key: its default, help, range or choices, the value of a bare ``--key`` (``flag``) and the
#: variable that sets it (``env``); the same field as every command's (hpctrain/options.py).
_key = options.option


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a training run, with its default (the digits run)."""

    # --- run -------------------------------------------------------------------------------
    name: str = _key("digits", "run name; the run directory defaults to runs/<name>")
    run_dir: str = _key("", "run directory for metrics.csv, config.toml, checkpoint.pt "
                            "(default: runs/<name>)")
    seed: int = _key(0, "seed of the model initialisation and of the shuffle (seed + epoch)")
    device: str = _key("cpu", "cpu, or cuda: one GPU per rank, by node-local rank",
                       choices=DEVICES)
    threads: int = _key(1, "torch threads per rank (keep 1 when ranks share cores)", minimum=1)
    # --- data ------------------------------------------------------------------------------
    data: str = _key("data/digits.h5", "HDF5 file with samples and labels; a missing file "
                                       "named digits.h5 is prepared automatically")
    dataset: str = _key("", "your own data instead of --data: package.module:factory, "
                        "factory() -> a torch Dataset of (sample, label) pairs")
    x: str = _key("x", "name of the samples dataset in the HDF5 file")
    y: str = _key("y", "name of the labels dataset in the HDF5 file")
    val_fraction: float = _key(0.2, "fraction of the rows held out for validation "
                                    "(seeded split)", minimum=0.0, below=1.0)
    split_seed: int = _key(0, "seed of the train/validation split")
    # --- model -----------------------------------------------------------------------------
    model: str = _key("mlp", f"model: a built-in name ({', '.join(MODELS)}) or your own, "
                      "package.module:factory with factory(sample_shape, classes) -> nn.Module")
    hidden: int = _key(128, "hidden width of mlp (and channels of cnn)", minimum=1)
    model_mb: float = _key(16.0, "parameter (= gradient) size of the wide model in MB",
                           positive=True)
    # --- optimisation ----------------------------------------------------------------------
    epochs: int = _key(20, "epochs to train", minimum=1)
    batch_size: int = _key(32, "batch size PER RANK; the global batch is batch_size x ranks",
                           minimum=1)
    optimizer: str = _key("sgd", "optimizer", choices=OPTIMIZERS)
    lr: float = _key(0.05, "learning rate for a global batch of base_batch_size",
                     positive=True)
    momentum: float = _key(0.9, "SGD momentum", minimum=0.0, below=1.0)
    weight_decay: float = _key(0.0, "L2 weight decay", minimum=0.0)
    lr_scaling: str = _key("linear", "linear: lr x global batch / base_batch_size "
                                     "(Goyal et al. 2017); none: lr as given",
                           choices=LR_SCALING)
    base_batch_size: int = _key(32, "the global batch size that lr is meant for", minimum=1)
    warmup_epochs: float = _key(2.0, "epochs of gradual warm-up from lr to the scaled lr",
                                minimum=0.0)
    lr_decay: str = _key("cosine", "after warm-up: cosine (down to 0 at the last step) or "
                                   "none (constant)", choices=LR_DECAY)
    shuffle: bool = _key(True, "reshuffle every epoch (seeded by seed + epoch)", flag=True)
    drop_last: bool = _key(False, "drop the last incomplete global batch instead of padding "
                                  "it with repeated samples", flag=True)
    max_steps: int = _key(0, "stop after this many steps in all (0: no limit); the lr "
                             "schedule still spans all epochs", minimum=0)
    eval_batch_size: int = _key(512, "batch size of the validation pass", minimum=1)
    # --- communication ---------------------------------------------------------------------
    regime: str = _key("allreduce", "allreduce (synchronous), server (a synchronous "
                                    "parameter server on rank 0), sharded-server (every rank "
                                    "serves a shard), async-server (asynchronous, rank 0 "
                                    "serves)", choices=tuple(REGIMES))
    allreduce: str = _key(DEFAULT_ALLREDUCE, "how --regime allreduce averages gradients "
                                             "(auto: per bucket size, from "
                                             "--allreduce-profile)",
                          choices=ALLREDUCE, env=ENV_ALLREDUCE)
    allreduce_profile: str = _key(auto.DEFAULT_PROFILE,
                                  "the profile --allreduce auto chooses from: params.json "
                                  "of `hpctrain study allreduce`", env=auto.ENV_PROFILE)
    bucket_mb: float = _key(4.0, "gradient bucket (fusion buffer) size in MB", positive=True)
    overlap: bool = _key(True, "reduce buckets during backward on a communication thread",
                         flag=True)
    # --- checkpoints and output ------------------------------------------------------------
    checkpoint_every: str = _key("1", "N or 'N epochs': every N epochs; 'N steps': every N "
                                      "steps; 0: never")
    resume: str = _key("", "checkpoint to resume from; 'auto' (or a bare --resume): the "
                           "newest intact checkpoint in <run_dir>, if there is one",
                       flag="auto")
    keep_checkpoints: int = _key(2, "checkpoints kept: checkpoint.pt and the K-1 before it "
                                    "(checkpoint.1.pt, ...), the fallback if it is damaged",
                                 minimum=1)
    progress: str = _key("auto", "progress bar: auto (only on a terminal), always, never",
                         choices=PROGRESS)
    tensorboard: str = _key("", "folder for TensorBoard event files, written by rank 0 "
                                "(needs the extra: pip install 'hpctrain[tensorboard]'); a "
                                "bare --tensorboard: <run_dir>/tensorboard; '': none",
                            flag="auto")
    # --- reliability -----------------------------------------------------------------------
    check_consistency: int = _key(0, "every N steps, compare a hash of the weights across "
                                     "ranks; a difference stops the run naming the ranks "
                                     "(0: only after start-up and at the end)", minimum=0)
    nonfinite: str = _key("error", "a NaN or Inf loss or gradient on any rank: error (stop, "
                                   "naming the ranks and step) or skip (every rank skips "
                                   "that update)", choices=NONFINITE)
    stall_warning: float = _key(60.0, "seconds a collective may wait for some ranks before "
                                      "rank 0 names them on stderr", positive=True)
    elastic: bool = _key(False, "go on when ranks are lost, from the last checkpoint: in "
                                "place on an MPI with fault tolerance (scripts/setup --ft), "
                                "else when python -m hpctrain.launch --elastic starts the job "
                                "again; implies --resume auto (--regime allreduce only)",
                         flag=True)
    stall_timeout: float = _key(600.0, "seconds of such a stall after which the job aborts "
                                       "(0: never)", minimum=0.0)

    def __post_init__(self):
        object.__setattr__(self, "regime", current_regime(self.regime))
        for f in fields(self):
            _check_value(f, getattr(self, f.name))
        checkpoint_interval(self.checkpoint_every)

    @property
    def run_path(self):
        """The run directory: ``run_dir``, or ``runs/<name>``."""
        return Path(self.run_dir or Path("runs") / self.name)

    @property
    def tensorboard_path(self):
        """The folder of the TensorBoard event files, or ``None`` (``tensorboard`` unset)."""
        if not self.tensorboard:
            return None
        return self.run_path / "tensorboard" if self.tensorboard == "auto" \
            else Path(self.tensorboard)

    def to_dict(self):
        """The configuration as a plain dictionary."""
        return dataclasses.asdict(self)

    def to_toml(self):
        """The configuration as a TOML file that ``--config`` reads back."""
        return "".join(f"{key} = {_toml_value(value)}\n" for key, value in self.to_dict().items())


def current_regime(name):
    """The regime ``name`` stands for: itself, or the new name of an old one
    (:data:`RENAMED_REGIMES`), with a warning that says so."""
    new = RENAMED_REGIMES.get(name)
    if new is None:
        return name
    LOG.warning(f"--regime {name} is now called --regime {new}, so that no regime shares a "
                f"name with an allreduce algorithm (--allreduce ps, ps-sharded): the old name "
                f"still works; give the new one")
    return new


def keys():
    """Every configuration key, in declaration order."""
    return [f.name for f in fields(TrainConfig)]


def describe_keys():
    """Two help lines per key: ``--key TYPE = default`` and what it does."""
    lines = []
    for f in fields(TrainConfig):
        choices = f.metadata["choices"]
        kind = "{" + ",".join(choices) + "}" if choices else f.type.__name__.upper()
        default = _toml_value(f.default)
        env = f" (or ${f.metadata['env']})" if f.metadata["env"] else ""
        lines.append(f"  --{f.name.replace('_', '-')} {kind} = {default}{env}\n"
                     f"      {f.metadata['help']}")
    return "\n".join(lines)


def load_config(path=None, overrides=(), environ=None):
    """The configuration from defaults, ``environ``, the TOML file ``path`` and ``overrides``.

    ``environ`` (``os.environ`` for a run started from the command line; ``None`` where a
    recorded configuration is rebuilt) sets the keys that name a variable. ``overrides`` is
    a sequence of ``(key, text)`` pairs from the command line; ``text`` is ``None`` for a
    bare ``--key``. Raises ``UsageError`` for unknown keys and bad values.
    """
    values = environment_values(environ or {})
    if path is not None:
        for key, value in read_toml(path).items():
            name = _known(key, f"in {path}")
            values[name] = _from_toml(_field(name), value, path)
    for key, text in overrides:
        name = _known(key, "on the command line")
        values[name] = _from_text(_field(name), text)
    return TrainConfig(**values)


def environment_values(environ):
    """``{key: value}`` for the keys whose variable ``environ`` sets (to a non-empty value);
    ``UsageError`` naming the variable for a bad value."""
    return options.environment_values(TrainConfig, environ)


def read_toml(path):
    """The flat table of the TOML file ``path``; ``UsageError`` if unreadable."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"configuration file {str(path)!r} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"configuration file {str(path)!r} is not valid TOML: {exc}") from None
    return table


def parse_overrides(tokens):
    """``["--lr=0.1", "--epochs", "3", "--resume"]`` → ``[("lr", "0.1"), ("epochs", "3"),
    ("resume", None)]``; anything that is not an option raises ``UsageError``."""
    pairs, i = [], 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise UsageError(f"unexpected argument {token!r}: options are --key=value or "
                             f"--key value")
        key, eq, text = token[2:].partition("=")
        if not eq:
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            text = None if nxt is None or nxt.startswith("--") else nxt
            i += text is not None
        pairs.append((key, text))
        i += 1
    return pairs


def checkpoint_interval(text):
    """``checkpoint_every`` as ``(count, unit)``: ``"2"`` → ``(2, "epoch")``, ``"50 steps"``
    → ``(50, "step")``, ``"0"`` → ``(0, "epoch")`` (never)."""
    match = re.fullmatch(r"\s*(\d+)\s*(e|epochs?|s|steps?)?\s*", str(text).lower())
    if not match:
        raise UsageError(f"checkpoint_every: {text!r} is not N, 'N epochs' or 'N steps'")
    unit = "step" if (match.group(2) or "e").startswith("s") else "epoch"
    return int(match.group(1)), unit


def _known(key, where):
    name = key.replace("-", "_")
    if name not in keys():
        raise UsageError(f"unknown configuration key {key!r} {where}; valid keys: "
                         f"{', '.join(keys())}")
    return name


def _field(name):
    return next(f for f in fields(TrainConfig) if f.name == name)


def _from_text(f, text):
    option = f"--{f.name.replace('_', '-')}"
    if text is None:
        if f.metadata["flag"] is None:
            raise UsageError(f"{option} needs a value ({f.metadata['help']})")
        return f.metadata["flag"]
    try:
        if f.type is bool:
            return units.boolean(text)
        return f.type(text)
    except ValueError:
        raise UsageError(f"{option}: {text!r} is not a valid {f.type.__name__}") from None


def _from_toml(f, value, path):
    accepted = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}[f.type]
    if f.name == "checkpoint_every" and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, bool) and f.type is not bool or not isinstance(value, accepted):
        raise UsageError(f"{f.name} in {path}: {value!r} is not a {f.type.__name__}")
    return f.type(value)


def _check_value(f, value):
    name = f.name
    if name == "model" and value not in MODELS and not plugins.is_spec(value):
        raise UsageError(f"model: {value!r} is not one of {', '.join(MODELS)}, nor a "
                         f"package.module:factory")
    if name == "dataset" and value and not plugins.is_spec(value):
        raise UsageError(f"dataset: {value!r} is not a package.module:factory")
    options.check_value(f, value)


def _toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    return repr(value)
