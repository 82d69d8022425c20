"""Publishing a file atomically: readers see the old file or the complete new one, never half.

A rank that dies while writing a checkpoint or a data set must not leave a truncated file
that the next run would trust. We write to a temporary file in the same directory, flush it
to disk (``fsync``), rename it over the target (atomic on POSIX within one file system) and
flush the directory so the rename itself survives a crash.
"""

import contextlib
import json
import os
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path next to ``path``; on success it replaces ``path`` atomically.

    If the body raises, the temporary file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _fsync_file(path):
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path, text):
    """Write ``text`` to ``path`` whole or not at all (:func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path, document, indent=1):
    """Write ``document`` as JSON (``indent``, no final newline) to ``path`` whole or not at
    all."""
    write_text(path, json.dumps(document, indent=indent))


def writable_folder(option, path):
    """``path`` as a ``Path`` if it is a folder, or can be made as one, where this process may
    write; else a ``UsageError`` for ``option`` naming the nearest existing part that is not a
    folder or not writable. Makes nothing."""
    from ..errors import UsageError

    path = Path(path)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{option} {path}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: cannot write in {existing} (no permission)")
    return path
