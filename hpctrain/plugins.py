"""``package.module:factory`` specs: the user's own model or data set on the command line."""

import importlib

from .errors import UsageError


def is_spec(value):
    """True for a ``module:attribute`` spec (a built-in name has no colon)."""
    return ":" in value


def load(spec, option):
    """The callable ``spec`` names; ``UsageError`` naming the import or attribute that failed.

    ``option`` (``--model``, ``--dataset``) is named in the message. Local: every rank
    imports alike, so every rank raises alike.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"{option} {spec!r}: expected package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to fix
        raise UsageError(f"{option} {spec!r}: cannot import module {module_name!r}: "
                         f"{type(exc).__name__}: {exc} (is it on PYTHONPATH?)") from None
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UsageError(f"{option} {spec!r}: module {module_name!r} has no attribute "
                             f"{attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(f"{option} {spec!r}: {attribute!r} is not callable")
    return target
