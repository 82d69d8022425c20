"""Whether a checkpoint can be resumed by this run: same model, data, batches, optimizer.

A difference is reported with the options that would resume it, or how to start afresh,
instead of silently training something else.
"""

import os

from ..errors import UsageError
from .config import RENAMED_REGIMES


def _model_options(config):
    size_key = "model_mb" if config["model"] == "wide" else "hidden"
    return f"--model {config['model']} --{size_key.replace('_', '-')} {config[size_key]}"


#: Keys a resumed run must share with its checkpoint: they fix the data and its split, the
#: order in which batches are drawn and what a saved sampler position means, and the
#: optimizer whose state is restored (``load_state_dict`` would silently put the saved
#: momentum and weight decay back; a new lr would change the schedule mid-run).
RESUME_KEYS = ("data", "dataset", "x", "y", "val_fraction", "split_seed", "seed", "batch_size",
               "shuffle", "drop_last", "optimizer", "lr", "momentum", "weight_decay")


def check_checkpoint(saved, config, size, path):
    """``UsageError`` unless checkpoint ``saved`` (read from ``path``) can go on as ``config``.

    Local: every rank reads the same checkpoint and raises alike.
    """
    built, wanted = _model_options(saved["config"]), _model_options(config.to_dict())
    if built != wanted:
        raise UsageError(f"checkpoint {str(path)!r} holds a model built with {built}; this "
                         f"run builds {wanted}: resume with {built}, or start afresh "
                         f"without --resume")
    differ = _resume_differences(saved["config"], config.to_dict())
    if differ:
        listed = ", ".join(f"{_option(k)} {saved['config'][k]} (this run: {v})"
                           for k, v in differ.items())
        same = " ".join(f"{_option(k)} {saved['config'][k]}" for k in differ)
        raise UsageError(f"checkpoint {str(path)!r} was written with other settings than "
                         f"this run's: {listed}; a resumed run must continue the same "
                         f"training: resume with {same}, or start a new run (another "
                         f"--run-dir, without --resume)")
    # A checkpoint written before the regimes were renamed holds the old name.
    was = RENAMED_REGIMES.get(saved.get("regime"), saved.get("regime"))
    was_sharded, is_sharded = was == "sharded-server", config.regime == "sharded-server"
    if was_sharded != is_sharded:
        raise UsageError(f"checkpoint {str(path)!r} was written by --regime "
                         f"{saved.get('regime')}; its optimizer state does not fit --regime "
                         f"{config.regime}")
    # Another rank count changes the global batch (the sampler then batches the rest of the
    # epoch anew, from the samples done) and the shards of a sharded optimizer, which
    # cannot be cut anew: a sharded run resumes on its own number of ranks only.
    if saved["world_size"] != size and is_sharded:
        raise UsageError(f"checkpoint {str(path)!r} was written by {saved['world_size']} "
                         f"ranks with a sharded optimizer: resume it on "
                         f"{saved['world_size']} ranks (this run has {size})")


def _resume_differences(saved, wanted):
    # {key: this run's value} for every RESUME_KEYS entry that differs from the checkpoint's;
    # a key the checkpoint lacks is not compared, and Adam has no momentum to compare.
    keys = [k for k in RESUME_KEYS if k in saved
            and not (k == "momentum" and wanted["optimizer"] == saved["optimizer"] == "adam")]
    return {k: wanted[k] for k in keys if not _same_setting(k, saved[k], wanted[k])}


def _same_setting(key, saved, wanted):
    if key == "data" and saved != wanted:
        # The same file named another way (relative, through a link) is the same data.
        try:
            return os.path.samefile(saved, wanted)
        except OSError:
            return os.path.abspath(saved) == os.path.abspath(wanted)
    return saved == wanted


def _option(key):
    return f"--{key.replace('_', '-')}"
