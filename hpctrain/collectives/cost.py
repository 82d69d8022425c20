"""The α-β-γ cost model of the allreduce algorithms, and its fit to measurements.

Every modelled algorithm's time is linear in the machine parameters::

    T(algo, n, p, N) = a·α + b·β + c·γ + a'·α' + b'·β'

with α the latency of one message (s), β the time per byte on a link (s/B), γ the time to
reduce one byte (s/B), all inside one node, and α', β' the same between nodes (N nodes of
p/N ranks). Each algorithm gives its own five coefficients (:meth:`Algorithm.cost
<.algorithm.Algorithm.cost>`): a node-oblivious one (ring, butterfly, ps) charges its
messages to α', β' when it spans several nodes (its slowest links are those), to α, β on
one; the tree charges each round to the links it crosses (ranks placed by slot: its first
rounds stay inside the nodes); the hierarchical allreduce charges its two node-local
phases to α, β and its phase between nodes to α', β'. A model with no α', β' (fitted on
one node) uses α, β for both.
Because the model is linear, the parameters are fitted to measured times by non-negative
least squares on relative error, and every prediction is a dot product.

Formulas of the flat algorithms (L = ⌈lg p⌉; p' = 2^⌊lg p⌋ and r = p - p'):

=================  ======================  ===================  ===================
algorithm          a (messages)            b (bytes on a link)  c (bytes reduced)
=================  ======================  ===================  ===================
ring               2(p-1)                  2n(p-1)/p            n(p-1)/p
tree               2L                      2nL                  nL
butterfly, small   lg p' (+2 if r)         n lg p' (+2n if r)   n lg p' (+n if r)
butterfly, large   2 lg p' (+2 if r)       2n(p'-1)/p' (+2n)    n(p'-1)/p' (+n)
ps (k servers)     2(p-1)                  2n(p-1)/k            n(p-1)/k
=================  ======================  ===================  ===================

The allgather, reduce-scatter, alltoall and broadcast algorithms carry their costs too
(``n``: the whole vector's bytes); ``coefficients`` and ``predict`` take ``collective=`` for
them. They are not fitted (the fit and ``auto`` see allreduce only), and their ``mpi`` is
not modelled:

===========================  ================  ===================  ===================
algorithm                    a (messages)      b (bytes on a link)  c (bytes reduced)
===========================  ================  ===================  ===================
allgather ring               p-1               n(p-1)/p             0
allgather butterfly          lg p' (+2 if r)   n(p'-1)/p' (+n)      0
reducescatter ring           p-1               n(p-1)/p             n(p-1)/p
reducescatter butterfly      lg p' (+2 if r)   n(p'-1)/p' (+n+n/p)  n(p'-1)/p' (+n)
alltoall pairwise            p-1               n(p-1)/p             0
broadcast tree               L                 nL                   0
broadcast scatter_allgather  L + p-1           2n(p-1)/p            0
===========================  ================  ===================  ===================

``mpi`` is predicted as the better of ring and butterfly (what a tuned library picks) and is
not fitted; Horovod adds a negotiation cycle of about 1 ms that this model does not have, so
it is not modelled. Nothing here imports MPI.
"""

from dataclasses import dataclass

import numpy as np

from .registry import ALGORITHMS, REGISTRIES

#: The butterfly's default switch to Rabenseifner, for studies that do not set it.
DEFAULT_SWITCH_BYTES = 64 << 10
#: The five parameters, in the order of a cost vector.
FIELDS = ("alpha", "beta", "gamma", "alpha_inter", "beta_inter")


@dataclass(frozen=True)
class Params:
    """Machine parameters: α (s per message), β (s per byte sent), γ (s per byte reduced)
    inside a node; α', β' (``alpha_inter``, ``beta_inter``) between nodes, ``None`` where
    they are the same as inside."""

    alpha: float
    beta: float
    gamma: float
    alpha_inter: float = None
    beta_inter: float = None

    def vector(self):
        """The five parameters as an array, α' and β' filled in from α and β if unset."""
        return np.array([self.alpha, self.beta, self.gamma,
                         self.alpha if self.alpha_inter is None else self.alpha_inter,
                         self.beta if self.beta_inter is None else self.beta_inter])

    def time(self, cost):
        """Seconds of an allreduce whose cost vector is ``cost``."""
        return float(np.dot(self.vector(), cost))

    def as_dict(self):
        """The parameters as a plain dict (for JSON); α', β' only when set."""
        values = dict(zip(FIELDS, (self.alpha, self.beta, self.gamma, self.alpha_inter,
                                   self.beta_inter)))
        return {key: value for key, value in values.items() if value is not None}

    @classmethod
    def from_dict(cls, data):
        """The inverse of :meth:`as_dict`."""
        return cls(*(None if data.get(key) is None else float(data[key]) for key in FIELDS))


def modelled():
    """Names of the registered algorithms the model predicts, in registration order."""
    return tuple(name for name, algorithm in ALGORITHMS.items() if algorithm.modelled)


def fitted_algorithms():
    """Names of the algorithms whose measurements the fit uses (one linear row each)."""
    return tuple(name for name in modelled() if ALGORITHMS[name].fitted)


def _values(algo, ranks, options, collective="allreduce"):
    algorithm = REGISTRIES[collective].get(algo)
    if algorithm is None or not algorithm.modelled:
        names = [name for name, a in REGISTRIES[collective].items() if a.modelled]
        raise KeyError(f"no cost formula for {collective} {algo!r}; modelled: "
                       f"{', '.join(names)}")
    known = {key: value for key, value in options.items() if key in algorithm.options}
    return algorithm, algorithm.parameters(ranks, known)


def coefficients(algo, nbytes, ranks, nodes=1, collective="allreduce", **options):
    """The cost vector (a, b, c, a', b') of ``collective``'s ``algo`` for ``nbytes`` on
    ``ranks`` ranks over ``nodes`` nodes; ``options`` are the algorithm's (others are
    ignored)."""
    if ranks == 1:
        return (0.0,) * len(FIELDS)
    algorithm, values = _values(algo, int(ranks), options, collective)
    return tuple(algorithm.cost(float(nbytes), int(ranks), int(nodes), values))


def predict(algo, nbytes, ranks, params, nodes=1, collective="allreduce", **options):
    """Predicted seconds of one ``collective`` (default allreduce) of ``nbytes`` on ``ranks``
    ranks over ``nodes``."""
    if ranks == 1:
        return 0.0
    algorithm, values = _values(algo, int(ranks), options, collective)
    return algorithm.predict(float(nbytes), int(ranks), int(nodes), values, params)


def fit(points, gamma=None, **options):
    """Least-squares ``Params`` from ``points`` = [(algo, nbytes, ranks, seconds[, nodes])].

    Relative residuals (each row divided by its time), so that 8-byte and 64 MiB points count
    alike; non-negative by ``scipy.optimize.nnls`` (a parameter the data would drive below
    zero is held at zero, the others refitted). Only the parameters some point depends on
    are fitted: α', β' stay ``None`` without points between nodes. With ``gamma`` given, γ
    is held at that value: for points that do not determine it (see :func:`determined`).
    """
    rows, times = _design(points, **options)
    if len(rows) < 3:
        raise ValueError(f"need at least 3 measured multi-rank points to fit, got {len(rows)}")
    design = np.array(rows) / np.array(times)[:, None]
    target = np.ones(len(times))
    unknowns = [j for j in range(len(FIELDS)) if design[:, j].any()]
    if gamma is not None:
        target = target - design[:, 2] * gamma
        unknowns = [j for j in unknowns if j != 2]
    best = np.zeros(len(FIELDS))
    best[unknowns] = nonnegative_fit(design[:, unknowns], target)
    if gamma is not None:
        best[2] = gamma
    used = set(unknowns) | ({2} if gamma is not None else set())
    values = [float(best[j]) if j in used or j < 3 else None for j in range(len(FIELDS))]
    return Params(*values)


def nonnegative_fit(columns, target):
    """``x >= 0`` minimising ``|columns @ x - target|`` (``scipy.optimize.nnls``): the one
    non-negative least-squares fit of the package (the cost model's, the ping-pong's α, β).

    Per message and per byte, the columns differ by about 1e8: solved on columns of unit norm
    (the scale changes neither the optimum nor the signs), then scaled back. SciPy is
    imported here, not with the module: every rank of every launch imports this module, and
    SciPy's start-up (0.3 s) is for the fits alone."""
    from scipy.optimize import nnls

    scale = np.linalg.norm(columns, axis=0)
    scale[scale == 0] = 1.0
    return nnls(columns / scale, target)[0] / scale


def determined(points, **options):
    """True if ``points`` fix γ and every other parameter they depend on (the used columns
    of their cost vectors are linearly independent)."""
    rows, _ = _design(points, **options)
    if len(rows) < 3:
        return False
    design = np.array(rows)
    used = design[:, design.any(axis=0)]
    scale = np.linalg.norm(used, axis=0)   # α's and β's columns differ by 1e8: compare shapes
    return bool(design[:, 2].any()) and np.linalg.matrix_rank(used / scale) == used.shape[1]


def _design(points, **options):
    rows, times = [], []
    fitted = fitted_algorithms()
    for algo, nbytes, ranks, seconds, *nodes in points:
        if algo in fitted and ranks > 1 and seconds > 0:
            rows.append(coefficients(algo, nbytes, ranks, *nodes, **options))
            times.append(seconds)
    return rows, times


def relative_errors(points, params, **options):
    """(predicted - measured) / measured for every modelled point, in order."""
    names = modelled()
    return [(predict(algo, n, p, params, *nodes, **options) - t) / t
            for algo, n, p, t, *nodes in points if algo in names and p > 1 and t > 0]


def params_of(profile):
    """The ``Params`` of a study's ``params.json`` content: the fitted ones, or the ping-pong
    ones (``p2p_prior``) where the fit is degenerate, with no cost per byte (every size
    would take the same time)."""
    return Params.from_dict(profile["p2p_prior"] if degenerate(profile) else profile["fitted"])


def degenerate(profile):
    """True where :func:`params_of` falls back to the ping-pong parameters."""
    fitted = profile["fitted"]
    return fitted["beta"] <= 0 and fitted["gamma"] <= 0 and not fitted.get("beta_inter")
