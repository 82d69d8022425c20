"""Checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint holds the model, the optimizer state, the sampler position (epoch, next
batch), the step, the running sums of a partly trained epoch, the random number generators'
states, the configuration and the number of ranks. Rank 0 writes it atomically (temporary
file + fsync + rename): a crash while writing leaves the previous checkpoint intact.

Resuming on CPU with the same seeds, ranks and deterministic allreduce algorithm
reproduces the uninterrupted run bit for bit: nothing random is drawn after start-up (the
shuffle is a function of seed + epoch) and every reduction sums in a fixed order.
"""

import random
from pathlib import Path

import numpy as np
import torch

from ..data.atomic import atomic_path
from ..errors import UsageError

FORMAT = 1
FILENAME = "checkpoint.pt"


def save(path, state):
    """Write ``state`` to ``path`` atomically (call on one rank only)."""
    with atomic_path(path) as tmp:
        torch.save({"format": FORMAT, **state}, tmp)
    return Path(path)


def load(path):
    """The checkpoint at ``path``; ``UsageError`` if it is missing or not a checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"checkpoint {str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the user's input error
        raise UsageError(f"checkpoint {str(path)!r} cannot be read: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UsageError(f"{str(path)!r} is not an hpctrain checkpoint (format {FORMAT})")
    return state


def resolve(resume, run_path):
    """The checkpoint file ``--resume`` names, or None for a fresh start.

    ``""``: start fresh; ``"auto"``: ``<run_path>/checkpoint.pt`` if it exists; anything
    else: that file, which must exist.
    """
    if not resume:
        return None
    if resume == "auto":
        path = Path(run_path) / FILENAME
        return path if path.is_file() else None
    if not Path(resume).is_file():
        raise UsageError(f"--resume: checkpoint {resume!r} does not exist")
    return Path(resume)


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
