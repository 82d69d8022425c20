"""The α-β-γ cost model of the allreduce algorithms, fitted to measurements.

Every modelled algorithm's time is linear in the three machine parameters::

    T(algo, n, p) = a·α + b·β + c·γ

with α the latency of one message (s), β the time per byte on a link (s/B) and γ the time to
reduce one byte (s/B); ``coefficients`` gives (a, b, c) for n bytes on p ranks. Because the
model is linear, α, β and γ are fitted to measured times by (non-negative) least squares on
relative error, and every prediction is a dot product.

Formulas (L = ⌈lg p⌉; p' = 2^⌊lg p⌋ and r = p - p' for the butterfly's folding):

=================  ======================  ===================  ===================
algorithm          a (messages)            b (bytes on a link)  c (bytes reduced)
=================  ======================  ===================  ===================
ring               2(p-1)                  2n(p-1)/p            n(p-1)/p
tree               2L                      2nL                  nL
butterfly, small   lg p' (+2 if r)         n lg p' (+2n if r)   n lg p' (+n if r)
butterfly, large   2 lg p' (+2 if r)       2n(p'-1)/p' (+2n)    n(p'-1)/p' (+n)
ps (k servers)     2(p-1)                  2n(p-1)/k            n(p-1)/k
=================  ======================  ===================  ===================

``ps`` is ``ps-sharded`` with k = 1: the server's link carries every contribution in and
every result out, 2(p-1)·n/b, where the ring's links carry 2(p-1)/p·n/b whatever p is.
``ps-sharded`` moves its bytes in two rounds, but in each round a rank sends (and a server
receives) p-1 messages. They are posted at once (non-blocking), so their time on the wire
overlaps; the work of sending and receiving each one, most of α on one host and much of it
on a NIC, does not. As in every formula here, a counts the messages a rank handles one after
the other: 2(p-1), an upper bound where the wire's latency dominates α (2α is the lower one).
``mpi`` is modelled as the better of ring and butterfly (what a tuned library picks); Horovod
adds a negotiation cycle of about 1 ms that this model does not have, so it is not modelled.
"""

import itertools
import math
import re
from dataclasses import asdict, dataclass

import numpy as np

MODELLED = ("ring", "tree", "butterfly", "ps", "ps-sharded", "mpi")
DEFAULT_SWITCH_BYTES = 64 << 10


@dataclass(frozen=True)
class Params:
    """Machine parameters: α (s per message), β (s per byte sent), γ (s per byte reduced)."""

    alpha: float
    beta: float
    gamma: float

    def as_dict(self):
        """The parameters as a plain dict (for JSON)."""
        return asdict(self)


def coefficients(algo, nbytes, ranks, switch_bytes=DEFAULT_SWITCH_BYTES, servers=None):
    """(a, b, c) such that the time of ``algo`` is a·α + b·β + c·γ."""
    n, p = float(nbytes), int(ranks)
    if p == 1:
        return (0.0, 0.0, 0.0)
    if algo == "ring":
        return (2.0 * (p - 1), 2 * n * (p - 1) / p, n * (p - 1) / p)
    if algo == "tree":
        steps = math.ceil(math.log2(p))
        return (2.0 * steps, 2 * n * steps, n * steps)
    if algo == "butterfly":
        return _butterfly(n, p, switch_bytes)
    if algo in ("ps", "ps-sharded"):
        k = 1 if algo == "ps" else min(servers or p, p)
        return (2.0 * (p - 1), 2 * n * (p - 1) / k, n * (p - 1) / k)
    raise KeyError(f"no cost formula for {algo!r}; modelled: {', '.join(MODELLED)}")


def _butterfly(n, p, switch_bytes):
    low = 1 << (p.bit_length() - 1)  # largest power of two <= p
    fold = p != low  # extra ranks send their data in first and get the result after
    lg = math.log2(low)
    if n < switch_bytes:
        a, b, c = lg, n * lg, n * lg
    else:
        a, b, c = 2 * lg, 2 * n * (low - 1) / low, n * (low - 1) / low
    return (a + 2 * fold, b + 2 * n * fold, c + n * fold)


def predict(algo, nbytes, ranks, params, **options):
    """Predicted seconds of one allreduce of ``nbytes`` on ``ranks`` ranks."""
    if algo == "mpi":
        return min(predict(a, nbytes, ranks, params, **options) for a in ("ring", "butterfly"))
    a, b, c = coefficients(algo, nbytes, ranks, **options)
    return a * params.alpha + b * params.beta + c * params.gamma


def fit(points, gamma=None, **options):
    """Least-squares ``Params`` from ``points`` = [(algo, nbytes, ranks, seconds), ...].

    Relative residuals (each row divided by its time), so that 8-byte and 64 MiB points count
    alike; non-negative by trying every subset of free parameters and keeping the best
    feasible solution (exact non-negative least squares for three unknowns). With ``gamma``
    given, γ is held at that value and only α and β are fitted: for points that do not
    determine all three (see :func:`determined`).
    """
    rows, times = _design(points, **options)
    if len(rows) < 3:
        raise ValueError(f"need at least 3 measured multi-rank points to fit, got {len(rows)}")
    design = np.array(rows) / np.array(times)[:, None]
    target = np.ones(len(times))
    unknowns = range(3)
    if gamma is not None:
        target, unknowns = target - design[:, 2] * gamma, range(2)
    best, best_err = np.zeros(3), float("inf")
    for size in range(len(unknowns), 0, -1):
        for free in itertools.combinations(unknowns, size):
            x = np.zeros(3)
            x[list(free)] = np.linalg.lstsq(design[:, free], target, rcond=None)[0]
            err = float(np.sum((design @ x - target) ** 2))
            if (x >= 0).all() and err < best_err:
                best, best_err = x, err
    if gamma is not None:
        best[2] = gamma
    return Params(*map(float, best))


def determined(points, **options):
    """True if ``points`` fix all three of α, β, γ (their coefficients have rank 3)."""
    rows, _ = _design(points, **options)
    if len(rows) < 3:
        return False
    design = np.array(rows)
    scale = np.linalg.norm(design, axis=0)   # α's and β's columns differ by 1e8: compare shapes
    return bool((scale > 0).all()) and np.linalg.matrix_rank(design / scale) == 3


def _design(points, **options):
    # mpi is the better of two formulas, not one linear row: it is predicted, never fitted.
    rows, times = [], []
    for algo, nbytes, ranks, seconds in points:
        if algo in MODELLED and algo != "mpi" and ranks > 1 and seconds > 0:
            rows.append(coefficients(algo, nbytes, ranks, **options))
            times.append(seconds)
    return rows, times


def relative_errors(points, params, **options):
    """(predicted - measured) / measured for every modelled point, in order."""
    return [(predict(algo, n, p, params, **options) - t) / t
            for algo, n, p, t in points if algo in MODELLED and p > 1 and t > 0]


def powers_of_two(low=8, high=1 << 30):
    """Every power of two from ``low`` (rounded up) to ``high`` bytes."""
    return [1 << k for k in range((max(low, 1) - 1).bit_length(), high.bit_length())]


def ring_wins(algo, ranks, params, sizes, **options):
    """For each of ``sizes``: is the ring predicted at least as fast as ``algo``?"""
    return [predict("ring", n, ranks, params, **options) <=
            predict(algo, n, ranks, params, **options) for n in sizes]


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


def params_of(profile):
    """The ``Params`` of a study's ``params.json`` content: the fitted ones, or the ping-pong
    ones (``p2p_prior``) where the fit is degenerate, with no cost per byte (every size
    would take the same time)."""
    chosen = profile["p2p_prior"] if degenerate(profile) else profile["fitted"]
    return Params(float(chosen["alpha"]), float(chosen["beta"]), float(chosen["gamma"]))


def degenerate(profile):
    """True where :func:`params_of` falls back to the ping-pong parameters."""
    return profile["fitted"]["beta"] <= 0 and profile["fitted"]["gamma"] <= 0


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
