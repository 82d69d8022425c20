"""Where the ring starts to win: the crossover size, predicted by the allreduce cost model
or measured, one rule for both, and the sizes a study predicts at.

The model itself (α-β-γ, and α', β' between nodes) lives with the algorithms, in
:mod:`hpctrain.collectives.cost`: each algorithm carries its own cost.
"""

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
