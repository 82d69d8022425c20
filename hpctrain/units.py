"""Numbers and sizes as a user writes them: the one parser of every count, number of seconds,
fraction, size in bytes and on/off word that a command line, an environment variable or a
configuration file gives.

Each parser raises ``ValueError`` saying what is wanted ("a whole number >= 1"); the caller
names the option or variable and gives an example (:func:`hpctrain.options` does so for every
command's options), so that every message of bad input has the same shape.
"""

import math
import numbers
import re

from .errors import ArgumentError

#: Binary size units, as nccl-tests writes them: ``8``, ``64K``, ``16M``, ``1G``.
SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
_WHOLE = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)


def wanted(kind=int, *, minimum=None, maximum=None, below=None, positive=False, unit=None):
    """What a value must be, in words: ``a whole number >= 1``, ``a number from 0 to 1``,
    ``a number of seconds > 0`` (``unit``: what it counts)."""
    noun = ("a whole number" if kind is int else "a number") + (f" of {unit}" if unit else "")
    if minimum is not None and maximum is not None:
        return f"{noun} from {minimum} to {maximum}"
    bounds = [f">= {minimum}" if minimum is not None else "",
              "> 0" if positive else "",
              f"< {below}" if below is not None else "",
              f"<= {maximum}" if maximum is not None else ""]
    return " ".join([noun, " and ".join(b for b in bounds if b)]).strip()


def number(value, kind=int, *, minimum=None, maximum=None, below=None, positive=False,
           unit=None):
    """``value`` (text, or a number from a file or a call) as a ``kind`` (``int``: a whole
    number written in digits; ``float``: a finite number) within the bounds; ``ValueError``
    saying what is wanted (:func:`wanted`) otherwise."""
    bounds = {"minimum": minimum, "maximum": maximum, "below": below, "positive": positive}
    parsed = _parse(value, kind)
    if parsed is None or not _within(parsed, **bounds):
        raise ValueError(wanted(kind, **bounds, unit=unit))
    return parsed


def _parse(value, kind):
    # The number in ``value``, or None; NaN and the infinities are no float here: they
    # would pass a lower bound, or compare false with every bound.
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if kind is int:
            return int(value) if _WHOLE.fullmatch(value) else None
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        return None
    if kind is int:
        return int(value) if isinstance(value, numbers.Integral) or \
            float(value).is_integer() else None
    return float(value)


def _within(value, minimum, maximum, below, positive):
    return not ((minimum is not None and value < minimum)
                or (maximum is not None and value > maximum)
                or (below is not None and value >= below)
                or (positive and not value > 0))


def boolean(text):
    """``1``/``true``/``yes``/``on`` → ``True``, ``0``/``false``/``no``/``off`` → ``False``
    (any case); ``ValueError`` otherwise."""
    word = str(text).strip().lower()
    if word in TRUE:
        return True
    if word in FALSE:
        return False
    raise ValueError("give 1 or 0 (true/false, yes/no, on/off)")


def parse_size(text):
    """Bytes in ``text`` (``8``, ``64K``, ``64KB``, ``64KiB``, ``16M``, ``1G``); must be >= 0.
    ``UsageError`` (a ``ValueError`` too) with the valid form otherwise."""
    raw = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    digits, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in SIZE_UNITS else (raw, "")
    if not (digits.isascii() and digits.isdigit()):
        raise ArgumentError(f"invalid size {text!r}: expected a whole number of bytes with an "
                            f"optional K, M or G suffix, e.g. 8, 64K, 16M, 1G")
    return int(digits) * SIZE_UNITS[unit]
