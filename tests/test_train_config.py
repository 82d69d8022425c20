"""The training configuration: defaults, TOML, overrides, and the errors bad input gets."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.train.config import (ALLREDUCE, REGIMES, RENAMED_REGIMES, TrainConfig,
                                   checkpoint_interval, keys, load_config, parse_overrides)

REPO = Path(__file__).resolve().parents[1]


def test_configs_digits_toml_spells_out_the_defaults():
    assert load_config(REPO / "configs" / "digits.toml") == TrainConfig()


def test_command_line_overrides_the_file_which_overrides_the_defaults(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('epochs = 3\nlr = 1\nallreduce = "ring"\n')
    config = load_config(path, parse_overrides(["--lr=0.5", "--batch-size", "8"]))
    assert (config.epochs, config.lr, config.allreduce, config.batch_size) == (3, 0.5, "ring", 8)
    assert isinstance(config.lr, float)


def test_the_environment_chooses_the_algorithm_below_the_file_and_the_command_line(tmp_path):
    environ = {"HPCTRAIN_ALLREDUCE": "tree", "HPCTRAIN_ALLREDUCE_PROFILE": "p.json"}
    assert TrainConfig().allreduce == "ring"          # the default of hpctrain.torch too
    config = load_config(None, (), environ)
    assert (config.allreduce, config.allreduce_profile) == ("tree", "p.json")
    path = tmp_path / "run.toml"
    path.write_text('allreduce = "butterfly"\n')
    assert load_config(path, (), environ).allreduce == "butterfly"
    assert load_config(path, parse_overrides(["--allreduce", "mpi"]), environ).allreduce == "mpi"
    # A configuration rebuilt from a record (no environ) never reads the variables.
    assert load_config(None, ()).allreduce == "ring"
    assert load_config(None, (), {"HPCTRAIN_ALLREDUCE": ""}).allreduce == "ring"


def test_a_bad_algorithm_in_the_environment_names_the_variable():
    with pytest.raises(UsageError, match=r"HPCTRAIN_ALLREDUCE='rign' \(the environment\): "
                                         r"allreduce: 'rign' is not one of"):
        load_config(None, (), {"HPCTRAIN_ALLREDUCE": "rign"})


@pytest.mark.parametrize("tokens, pairs", [
    (["--lr=0.1"], [("lr", "0.1")]),
    (["--lr", "0.1", "--epochs=2"], [("lr", "0.1"), ("epochs", "2")]),
    (["--resume", "--shuffle"], [("resume", None), ("shuffle", None)]),
    (["--resume"], [("resume", None)]),
    (["--lr", "-0.5"], [("lr", "-0.5")]),
])
def test_parse_overrides(tokens, pairs):
    assert parse_overrides(tokens) == pairs


def test_a_bare_word_is_not_an_option():
    with pytest.raises(UsageError, match="--key=value"):
        parse_overrides(["epochs=3"])


def test_bare_flags_take_their_flag_value():
    config = load_config(None, parse_overrides(["--resume", "--drop-last"]))
    assert config.resume == "auto" and config.drop_last is True


def test_a_bare_key_without_a_flag_value_needs_a_value():
    with pytest.raises(UsageError, match="--epochs needs a value"):
        load_config(None, [("epochs", None)])


def test_unknown_key_lists_the_valid_keys(tmp_path):
    with pytest.raises(UsageError) as info:
        load_config(None, [("lrr", "0.1")])
    assert "unknown configuration key 'lrr'" in str(info.value)
    assert all(key in str(info.value) for key in keys())
    path = tmp_path / "bad.toml"
    path.write_text("epochz = 3\n")
    with pytest.raises(UsageError, match="unknown configuration key 'epochz' in"):
        load_config(path)


@pytest.mark.parametrize("key, text, message", [
    ("allreduce", "rign", "not one of " + ", ".join(ALLREDUCE)),
    ("regime", "sync", "not one of allreduce, server, sharded-server, async-server"),
    ("epochs", "three", "not a valid int"),
    ("epochs", "0", "epochs must be >= 1"),
    ("val_fraction", "1", "val_fraction must be < 1.0"),
    ("lr", "0", "lr must be > 0"),
    ("shuffle", "maybe", "not a valid bool"),
    ("checkpoint_every", "often", "not N, 'N epochs' or 'N steps'"),
])
def test_invalid_values_say_what_is_valid(key, text, message):
    with pytest.raises(UsageError, match=message):
        load_config(None, [(key, text)])


@pytest.mark.parametrize("key, text, valid", [
    ("val_fraction", "nan", ">= 0.0 and < 1.0"),
    ("model_mb", "inf", "> 0"),
    ("lr", "-inf", "> 0"),
    ("weight_decay", "inf", ">= 0.0"),
    ("stall_timeout", "nan", ">= 0.0"),
])
def test_non_finite_numbers_are_rejected_with_the_valid_range(tmp_path, key, text, valid):
    message = f"{key} must be a finite number {valid}, got {float(text)}"
    with pytest.raises(UsageError, match=re.escape(message)):
        load_config(None, [(key, text)])
    path = tmp_path / "run.toml"
    path.write_text(f"{key} = {text}\n")     # TOML spells them the same way
    with pytest.raises(UsageError, match=re.escape(message)):
        load_config(path)


def test_toml_values_are_type_checked(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('epochs = "3"\n')
    with pytest.raises(UsageError, match="epochs in .*: '3' is not a int"):
        load_config(path)
    path.write_text("shuffle = 1\n")
    with pytest.raises(UsageError, match="is not a bool"):
        load_config(path)


def test_missing_and_broken_toml_files(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_config(tmp_path / "none.toml")
    path = tmp_path / "broken.toml"
    path.write_text("epochs = = 3\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_config(path)


@pytest.mark.parametrize("text, expected", [
    ("1", (1, "epoch")), ("0", (0, "epoch")), ("2 epochs", (2, "epoch")), ("3e", (3, "epoch")),
    ("50 steps", (50, "step")), ("7s", (7, "step")), (4, (4, "epoch")),
])
def test_checkpoint_interval(text, expected):
    assert checkpoint_interval(text) == expected


def test_resolved_configuration_reads_back(tmp_path):
    config = load_config(None, [("allreduce", "tree"), ("lr", "0.3"), ("name", 'a "b"')])
    path = tmp_path / "config.toml"
    path.write_text(config.to_toml())
    assert load_config(path) == config


def test_run_path_defaults_to_runs_name():
    assert TrainConfig(name="x").run_path == Path("runs/x")
    assert TrainConfig(run_dir="elsewhere").run_path == Path("elsewhere")


def test_cli_rejects_unknown_keys_with_the_list_of_valid_ones():
    result = subprocess.run([sys.executable, "-m", "hpctrain", "train", "--lrr=0.1"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 2
    assert "unknown configuration key 'lrr'" in result.stderr
    assert "batch_size" in result.stderr and "Traceback" not in result.stderr


def test_cli_help_lists_every_key():
    result = subprocess.run([sys.executable, "-m", "hpctrain", "train", "--help"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0
    for key in keys():
        assert f"--{key.replace('_', '-')} " in result.stdout


@pytest.mark.parametrize("old, new", sorted(RENAMED_REGIMES.items()))
def test_a_regime_s_old_name_still_works_and_says_the_new_one(tmp_path, caplog, old, new):
    path = tmp_path / "old.toml"
    path.write_text(f'regime = "{old}"\n')
    for config in (load_config(None, [("regime", old)]), load_config(path),
                   TrainConfig(regime=old)):
        assert config.regime == new
    said = [r.getMessage() for r in caplog.records if "is now called" in r.getMessage()]
    assert said == [f"--regime {old} is now called --regime {new}, so that no regime shares "
                    f"a name with an allreduce algorithm (--allreduce ps, ps-sharded): the "
                    f"old name still works; give the new one"] * 3


def test_every_regime_names_a_regime_class():
    from hpctrain.train.build import regime_class
    from hpctrain.train.regimes import Regime

    assert all(issubclass(regime_class(name), Regime) for name in REGIMES)
    assert not set(RENAMED_REGIMES) & set(REGIMES) and set(RENAMED_REGIMES.values()) <= \
        set(REGIMES)


def test_a_checkpoint_of_an_old_regime_name_resumes_under_the_new_one():
    from hpctrain.train.resume import check_checkpoint

    config = TrainConfig(regime="sharded-server")
    saved = {"config": config.to_dict(), "world_size": 2, "regime": "ps-sharded"}
    check_checkpoint(saved, config, 2, "checkpoint.pt")        # raises nothing
    with pytest.raises(UsageError, match="was written by --regime ps-sharded"):
        check_checkpoint(saved, TrainConfig(regime="server"), 2, "checkpoint.pt")
