"""Checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint holds the model, the optimizer state, the sampler position (epoch, next
batch), the step, the running sums of a partly trained epoch, the random number generators'
states, the configuration and the number of ranks.

On disk: one header line (a magic word, the payload's length and SHA-256) and the payload,
``torch.save`` of the state. ``load`` checks both, so a truncated or corrupted file is an
error that says which, never weights silently wrong. Rank 0 writes atomically (temporary
file + fsync + rename): a crash while writing leaves the previous checkpoint intact. The
newest is ``checkpoint.pt``; with ``keep`` > 1 the older ones move to ``checkpoint.1.pt``,
``checkpoint.2.pt``, … (older = higher number), and ``--resume auto`` takes the newest one
that passes its checks, reporting every damaged one it skips. ``checkpoint.pt`` exists at
every moment of a save: the previous one gets its second name ``checkpoint.1.pt`` (a hard
link) before the new file replaces it in one rename.

Resuming on CPU with the same seeds, ranks and deterministic allreduce algorithm
reproduces the uninterrupted run bit for bit: nothing random is drawn after start-up (the
shuffle is a function of seed + epoch) and every reduction sums in a fixed order.
"""

import hashlib
import io
import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from .. import faults
from ..data.atomic import atomic_path
from ..errors import UsageError
from ..log import logger

LOG = logger()

FORMAT = 2
FILENAME = "checkpoint.pt"
MAGIC = b"hpctrain-checkpoint "


class CheckpointError(UsageError):
    """A checkpoint file that is missing, truncated, corrupted or not a checkpoint."""


def save(path, state, keep=1):
    """Write ``state`` to ``path`` atomically, keeping ``keep`` checkpoints (one rank only).

    The older checkpoints move one place down the list (``path`` is also named
    ``<stem>.1<suffix>``, and so on) only once the new one is completely written; the oldest
    beyond ``keep`` is overwritten. Then the new file replaces ``path`` in one rename, so a
    crash at any point leaves ``path`` holding the previous or the new checkpoint.
    """
    path = Path(path)
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buffer)
    payload = buffer.getbuffer()
    header = {"format": FORMAT, "bytes": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest()}
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(MAGIC + json.dumps(header).encode() + b"\n")
            f.write(payload)
        # Written, not yet published: a failure here must leave the previous one usable.
        faults.inject("train.checkpoint", 0)
        _rotate(path, keep)
    return path


def load(path):
    """The checkpoint at ``path``; ``CheckpointError`` if it is missing or damaged."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    with open(path, "rb") as f:
        line = f.readline(4096)
        payload = f.read()
    header = _header(path, line)
    if len(payload) != header["bytes"]:
        raise CheckpointError(f"checkpoint {str(path)!r} is truncated: it holds "
                              f"{len(payload)} of {header['bytes']} bytes")
    if hashlib.sha256(payload).hexdigest() != header["sha256"]:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupted: its SHA-256 differs "
                              f"from the one written with it")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the user's input error
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: {exc}") from None
    return state


def _header(path, line):
    if not line.startswith(MAGIC):
        raise CheckpointError(f"{str(path)!r} is not an hpctrain checkpoint (format "
                              f"{FORMAT}); write one with 'hpctrain train'")
    try:
        header = json.loads(line[len(MAGIC):])
        if header["format"] != FORMAT:
            raise ValueError(f"format {header['format']}, expected {FORMAT}")
        int(header["bytes"]), str(header["sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {str(path)!r} has a damaged header: {exc}") from None
    return header


def history(path):
    """``path`` and its older rotated copies that exist, newest first."""
    path = Path(path)
    pattern = re.compile(re.escape(path.stem) + r"\.(\d+)" + re.escape(path.suffix))
    older = sorted((int(m.group(1)), p) for p in path.parent.glob(f"{path.stem}.*{path.suffix}")
                   if (m := pattern.fullmatch(p.name)))
    return [p for p in [path] if p.is_file()] + [p for _, p in older]


def _rotate(path, keep):
    # Oldest first, so that no rename overwrites a file that is still to be moved. ``path``
    # itself is not moved but linked: moving it would leave no checkpoint.pt until the new
    # one is renamed into place, and a crash in between would leave none at all.
    names = [path] + [_older(path, i) for i in range(1, keep)]
    for i in range(len(names) - 1, 1, -1):
        if names[i - 1].is_file():
            os.replace(names[i - 1], names[i])
    if keep > 1 and path.is_file():
        _second_name(path, names[1])


def _second_name(path, name):
    # Atomically, so that ``name`` is the older checkpoint or the previous one, never half of
    # it. A copy where the file system has no hard links.
    with atomic_path(name) as tmp:
        try:
            os.link(path, tmp)
        except OSError:
            shutil.copyfile(path, tmp)


def _older(path, i):
    return path.with_name(f"{path.stem}.{i}{path.suffix}")


def find(resume, run_path, log=None):
    """The checkpoint ``--resume`` names, as ``(path, state)``, or ``(None, None)``.

    ``""``: start fresh. ``"auto"``: the newest intact one of ``<run_path>/checkpoint.pt``
    and its older copies, each damaged one reported through ``log``; none at all: start
    fresh; all damaged: ``CheckpointError``. Any other value: that file, which must exist
    and be intact.
    """
    log = log or LOG.warning
    if not resume:
        return None, None
    if resume != "auto":
        try:
            return Path(resume), load(resume)
        except CheckpointError as exc:
            raise CheckpointError(f"--resume: {exc}") from None
    candidates, problems = history(Path(run_path) / FILENAME), []
    for path in candidates:
        try:
            state = load(path)
        except CheckpointError as exc:
            problems.append(str(exc))
            log(f"skipping a damaged checkpoint: {exc}")
            continue
        if problems:
            log(f"resuming from the previous intact checkpoint {str(path)!r}")
        return path, state
    if problems:
        raise CheckpointError(f"--resume auto: no intact checkpoint in {str(run_path)!r}: "
                              f"{'; '.join(problems)}; start afresh without --resume")
    return None, None


def rng_state():
    """The states of Python's, NumPy's and torch's global generators (checkpoint-safe types)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached)}


def set_rng_state(state):
    """Restore the generators from ``rng_state()``."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
