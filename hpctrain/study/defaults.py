"""The default range of every term of a plan that its user does not give or measure.

``study plan`` never takes a silent zero: a term not given (``--spread``, ``--slowdown``,
``--update-ms``, ``--negotiation-us``, ``--negotiation-rank-us``, ``--framework-us``,
``--measured-efficiency``) takes the range ``data/defaults.toml`` gives it, each with its
source and its basis (from the term's own measurements, from an argument, or chosen to hit
published whole runs). The value is the middle of the range, the band's ends its ends
(:class:`.overheads.Figure`).

A file that is missing or malformed is refused with one line naming the entry and an example
of a good one (``UsageError``: exit 2).
"""

import math
import os
import tomllib
from dataclasses import dataclass, replace

from ..errors import UsageError
from .overheads import FRAMEWORK_TERMS, Figure, Overheads

#: The shipped file, and how the reports name it.
PATH = os.path.join(os.path.dirname(__file__), "data", "defaults.toml")
SHIPPED = "hpctrain/study/data/defaults.toml"
#: Every entry the file must have, in the order the plan lists them.
TERMS = ("spread", "slowdown", "slowdown_node", "update_s", "tensor_s", "rank_s", "framework_ddp",
         "framework_hpctrain", "framework_horovod", "share", "share_node")
#: How a range was chosen.
BASES = {"term": "from the term's own measurements",
         "argument": "from how the step works",
         "whole runs": "chosen to hit published whole runs (the runs its source names)"}
#: An entry as it should read, for the messages.
EXAMPLE = ('[slowdown] low = 1.015, high = 1.036, source = "NVIDIA/nccl#689", '
           'basis = "term"')
#: How each term reads: its unit and the factor to it.
UNITS = {"spread": (" %", 100), "update_s": (" ms", 1e3), "tensor_s": (" µs", 1e6),
         "rank_s": (" µs", 1e6), "share": (" % of compute", 100),
         **dict.fromkeys(FRAMEWORK_TERMS, (" µs per gradient", 1e6)),
         "share_node": (" % of compute", 100)}
#: The smallest value each entry may take (a slowdown is a factor of at least 1).
MINIMUM = {"slowdown": 1.0, "slowdown_node": 1.0}


@dataclass(frozen=True)
class Defaults:
    """The defaults of a file: a :class:`Figure` per term (value the middle of its range)
    and per term its basis (a key of :data:`BASES`)."""

    figures: dict
    basis: dict
    path: str = SHIPPED

    def overheads(self, nvlink=False):
        """:class:`Overheads` of the defaults alone; ``nvlink``: reductions inside a node run
        over NVLink (else PCIe: its reductions cross the host as those between nodes do, so
        a network adapter's slowdown and the residual of a step leaving the node cover
        them)."""
        figures = dict(self.figures)
        if not nvlink:
            figures["slowdown_node"] = replace(figures["slowdown"])
            figures["share_node"] = replace(figures["share"])
        return Overheads(**figures)

    def describe(self, term):
        """``(range text, source, basis in words)`` of ``term``."""
        figure = self.figures[term]
        return figure.describe(*UNITS.get(term, ("", 1.0))), figure.source, \
            BASES[self.basis[term]]


def read_toml(option, path, what, item, example):
    """The TOML document at ``path``, given with ``option``; ``UsageError`` saying what is
    wrong and what ``item`` of ``what`` reads like (``example``) where it cannot be read."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror}; give {what}, e.g. {item} "
                         f"{example}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{option} {path}: not TOML ({exc}); {item} reads {example}") \
            from None


def load(path=None):
    """The :class:`Defaults` of ``path`` (the shipped file without one); ``UsageError`` naming
    the file, the entry and an example of a good one where it is missing or malformed."""
    path = path or PATH
    document = read_toml("--defaults", path, "a TOML file of default ranges", "an entry",
                         EXAMPLE)
    figures, basis = {}, {}
    for term in TERMS:
        figures[term], basis[term] = _entry(path, term, document.get(term))
    unknown = sorted(set(document) - set(TERMS))
    if unknown:
        raise UsageError(f"--defaults {path}: unknown entry [{unknown[0]}]; the entries are "
                         f"{', '.join(TERMS)}")
    return Defaults(figures, basis, SHIPPED if path == PATH else path)


def _entry(path, term, table):
    # (Figure, basis) of one [term] table, or UsageError naming it.
    where = f"--defaults {path}: entry [{term}]"
    if not isinstance(table, dict):
        raise UsageError(f"{where} is missing; e.g. {EXAMPLE}")
    extra = sorted(set(table) - {"low", "high", "source", "basis"})
    if extra:
        raise UsageError(f"{where}: unknown key {extra[0]!r}; give low, high, source and "
                         f"basis, e.g. {EXAMPLE}")
    low, high = table.get("low"), table.get("high")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
               for x in (low, high)):
        raise UsageError(f"{where}: low and high must be numbers, e.g. {EXAMPLE}")
    if low > high:
        raise UsageError(f"{where}: low {low:g} is above high {high:g} (a range given "
                         f"backwards); e.g. {EXAMPLE}")
    if low < MINIMUM.get(term, 0.0):
        raise UsageError(f"{where}: low {low:g} is below {MINIMUM.get(term, 0.0):g}; e.g. "
                         f"{EXAMPLE}")
    source, kind = table.get("source"), table.get("basis")
    if not isinstance(source, str) or not source.strip():
        raise UsageError(f"{where}: no source; say where the range comes from, e.g. {EXAMPLE}")
    if kind not in BASES:
        raise UsageError(f"{where}: basis {kind!r} is not one of {', '.join(map(repr, BASES))};"
                         f" e.g. {EXAMPLE}")
    return Figure((low + high) / 2, float(low), float(high),
                  f"default, {BASES[kind]}: {source}"), kind
