"""One typed configuration per command (hpctrain/options.py) and one parser of numbers and
sizes (hpctrain/units.py): every command's options are generated from its dataclass, layered
defaults < environment < preset < command line, and bad input is one line naming the option
with a good example, exit status 2."""

import argparse
import dataclasses
import subprocess
import sys

import pytest

from hpctrain import options, units
from hpctrain.bench.blocks import PLUGINS
from hpctrain.bench.config import CollectiveBench, RootedBench, SizeSweep, TorchDistributedBench
from hpctrain.cli import build_parser
from hpctrain.errors import UsageError
from hpctrain.info import InfoConfig
from hpctrain.launch import elastic as elastic_launcher
from hpctrain.launch import horovodrun
from hpctrain.study.config import (AllreduceStudy, CalibrateStudy, FattreeStudy, PlanStudy,
                                   PredictStudy, TrainStudy)

#: (command line, its configuration class, the command's own defaults beside the class's)
COMMANDS = [
    (["bench", "allreduce"], CollectiveBench, {}),
    (["bench", "broadcast"], RootedBench,
     {"minbytes": units.parse_size(PLUGINS["broadcast"].command.smallest)}),
    (["bench", "p2p"], SizeSweep, {"minbytes": 1, "maxbytes": 16 << 20}),
    (["bench", "torch-distributed"], TorchDistributedBench, {}),
    (["info"], InfoConfig, {}),
    (["study", "allreduce"], AllreduceStudy, {}),
    (["study", "train"], TrainStudy, {}),
    (["study", "plan"], PlanStudy, {}),
    (["study", "calibrate"], CalibrateStudy, {}),
    (["study", "fattree"], FattreeStudy, {}),
    (["study", "predict"], PredictStudy, {}),
]


def _subparser(argv):
    parser = build_parser()
    for word in argv:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


@pytest.mark.parametrize("argv, cls, own", COMMANDS, ids=lambda x: " ".join(x)
                         if isinstance(x, list) else "")
def test_the_generated_options_are_the_dataclass(argv, cls, own):
    parsed = build_parser().parse_args(argv)
    assert parsed.config == cls(**own) and parsed.given == frozenset()
    actions = {a.dest: a for a in _subparser(argv)._actions}
    for f in dataclasses.fields(cls):
        action = actions.get(f.name)
        if action is None:             # -o of a collective that does not reduce
            assert f.name == "op" and parsed.op == "sum"
            continue
        assert action.option_strings == list(f.metadata["flags"] or [options.spelling(f)])
        help_ = f.metadata["help"].split("{default}")[0]
        if f.name == "root":          # the collective says what its root does
            help_ = PLUGINS[argv[1]].command.root
        assert action.help.startswith(help_), f.name
        assert getattr(parsed, f.name) == getattr(parsed.config, f.name)


def test_warmup_0_is_0_and_iters_0_is_refused():
    assert build_parser().parse_args(["bench", "allreduce", "-w", "0"]).warmup == 0
    assert build_parser().parse_args(["study", "allreduce", "--warmup", "0"]).warmup == 0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "allreduce", "--iters", "0"])


@dataclasses.dataclass
class Toy:
    """A configuration with every layer: a variable, a preset, a range."""

    PRESETS = {"quick": {"count": 3}}
    count: int = options.option(10, "how many (default: {default})", env="TOY_COUNT",
                                minimum=1, flags=("-n", "--count"))
    quick: bool = options.option(False, "fewer", flag=True)

    def __post_init__(self):
        options.check(self)


def _toy(argv):
    parser = options.Parser(prog="toy")
    options.add_arguments(parser, Toy)
    namespace, _ = parser.parse_known_args(argv)
    return namespace


def test_defaults_then_the_environment_then_a_preset_then_the_command_line(monkeypatch):
    monkeypatch.delenv("TOY_COUNT", raising=False)
    assert _toy([]).count == 10
    monkeypatch.setenv("TOY_COUNT", "7")
    assert _toy([]).count == 7
    assert _toy(["--quick"]).count == 3
    assert _toy(["--quick", "-n", "5"]).count == 5
    monkeypatch.setenv("TOY_COUNT", "0")         # out of range: refused, naming the variable
    with pytest.raises(SystemExit):
        _toy([])
    assert options.build(Toy, {"count": 4}, {"TOY_COUNT": "9"}).count == 4
    with pytest.raises(UsageError, match=r"TOY_COUNT='x' \(the environment\)"):
        options.build(Toy, {}, {"TOY_COUNT": "x"})


@pytest.mark.parametrize("argv, says", [
    (["bench", "allreduce", "--warmup", "-1"],
     "argument -w/--warmup: '-1': give a whole number >= 0; e.g. --warmup 5"),
    (["bench", "allreduce", "-n", "x"], "argument -n/--iters: 'x': give a whole number >= 1"),
    (["bench", "p2p", "-b", "8Q"], "argument -b/--minbytes: '8Q': invalid size '8Q'"),
    (["bench", "allreduce", "--device", "gpu"], "'gpu' is not one of cpu, cuda; e.g. "),
    (["study", "train", "--epochs", "1"], "argument --epochs: '1': give a whole number >= 2"),
    (["study", "calibrate", "--set", "some"], "'some' is not one of tuning, held-out"),
    (["study", "plan", "--fusion-mb", "nan"], "argument --fusion-mb: 'nan': give a number"),
])
def test_bad_input_is_one_line_naming_the_option_and_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and says in err, err
    assert err.startswith(f"hpctrain {' '.join(argv[:2])}: error: ")


def test_a_bad_value_ends_the_command_with_2_before_anything_starts():
    done = subprocess.run([sys.executable, "-m", "hpctrain", "bench", "allreduce", "-w", "-1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and "--warmup" in done.stderr and "e.g." in done.stderr


@pytest.mark.alone
def test_a_bad_value_under_mpirun_ends_every_rank_with_2(mpirun, hpctrain_cmd):
    result = mpirun(2, [*hpctrain_cmd, "bench", "allreduce", "--warmup", "-1"], timeout=60)
    assert result.returncode == 2, result.output
    assert result.output.count("give a whole number >= 0; e.g. --warmup 5") == 1, result.output
    assert "Traceback" not in result.output and "MPI_ABORT" not in result.output


def test_the_launchers_options_are_their_dataclasses():
    for module in (elastic_launcher, horovodrun):
        table = options.by_flag(module.Options)
        text = options.help_lines(module.Options)
        for f in dataclasses.fields(module.Options):
            for flag in (*f.metadata.get("flags", ()), *f.metadata.get("off", ())):
                assert table[flag] is f and flag in text
    tuning = [f for f in dataclasses.fields(horovodrun.Tuning)]
    assert {variable for variable, _ in horovodrun.SETTINGS.values()} | \
        {variable for variable, _ in horovodrun.SWITCHES.values()} == \
        {f.metadata["env"] for f in tuning}
    assert all(option in horovodrun.USAGE for option in horovodrun.SETTINGS)


@pytest.mark.parametrize("text, kind, bounds, value", [
    ("0", int, {"minimum": 0}, 0), (" 12 ", int, {}, 12), ("2.5", float, {"positive": True}, 2.5),
    (3, int, {}, 3), (4.0, int, {}, 4), ("1", float, {"minimum": 0, "maximum": 1}, 1.0),
])
def test_one_parser_of_numbers(text, kind, bounds, value):
    assert units.number(text, kind, **bounds) == value


@pytest.mark.parametrize("text, kind, bounds, says", [
    ("-1", int, {"minimum": 0}, "a whole number >= 0"),
    ("1.5", int, {"minimum": 1}, "a whole number >= 1"),
    ("\u00b2", int, {}, "a whole number"),
    ("nan", float, {"minimum": 0}, "a number >= 0"),
    ("inf", float, {}, "a number"),
    (True, int, {}, "a whole number"),
    ("0", float, {"positive": True, "unit": "seconds"}, "a number of seconds > 0"),
    ("2", float, {"minimum": 0, "maximum": 1}, "a number from 0 to 1"),
])
def test_one_parser_of_numbers_says_what_it_wants(text, kind, bounds, says):
    with pytest.raises(ValueError, match=f"^{says}$"):
        units.number(text, kind, **bounds)


def test_one_parser_of_sizes_everywhere():
    from hpctrain.bench import sizes

    assert sizes.parse_size is units.parse_size
    assert units.parse_size("64K") == 65536 and units.parse_size("1GiB") == 1 << 30
    with pytest.raises(UsageError, match="e.g. 8, 64K, 16M, 1G"):
        units.parse_size("1.5M")
