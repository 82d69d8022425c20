"""What the study derives from the allreduce cost model, and the units it reads.

The model itself (α-β-γ, and α', β' between nodes) lives with the algorithms, in
:mod:`hpctrain.collectives.cost`: each algorithm carries its own cost. Here: the sizes a
study predicts at, where the ring starts to win, bus bandwidth and link rates.
"""

import re

from ..collectives import cost


def powers_of_two(low=8, high=1 << 30):
    """Every power of two from ``low`` (rounded up) to ``high`` bytes."""
    return [1 << k for k in range((max(low, 1) - 1).bit_length(), high.bit_length())]


def ring_wins(algo, ranks, params, sizes, **options):
    """For each of ``sizes``: is the ring predicted at least as fast as ``algo``?"""
    return [cost.predict("ring", n, ranks, params, **options) <=
            cost.predict(algo, n, ranks, params, **options) for n in sizes]


def crossover_size(sizes, wins):
    """The smallest of the ascending ``sizes`` from which on the ring is never slower.

    ``wins[i]``: the ring is at least as fast at ``sizes[i]``. ``sizes[0]`` when the ring
    wins everywhere in range; ``None`` when it loses at the largest size (whether or not it
    won somewhere below). The one rule for predicted and measured crossovers.
    """
    start = len(wins)
    while start > 0 and wins[start - 1]:
        start -= 1
    return sizes[start] if start < len(sizes) else None


def busbw(nbytes, ranks, seconds):
    """nccl-tests' bus bandwidth of an allreduce in B/s: n/t · 2(p-1)/p."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks if seconds > 0 else 0.0


def parse_rate(text):
    """Bytes per second in a link rate: ``100gbit``, ``25Gbps``, ``800mbit`` (bits) or ``42GB/s``.

    Lower-case ``b`` and ``bit``/``bps`` are bits, upper-case ``B`` is bytes, as network
    vendors write them.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgG])(bit|bps|b/s|b|B/s|Bps|B)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"invalid link rate {text!r}: expected e.g. 100gbit, 25Gbps, 800mbit "
                         "or 42GB/s")
    value, prefix, unit = float(match.group(1)), match.group(2).lower(), match.group(3)
    scale = {"k": 1e3, "m": 1e6, "g": 1e9}[prefix]
    return value * scale / (1 if unit.startswith("B") else 8)
