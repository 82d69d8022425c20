"""``algo="auto"``: the allreduce algorithm chosen per message size from a saved profile.

A profile is the ``params.json`` that ``hpctrain study allreduce`` writes: the fitted α-β-γ
model and, for every rank count the study measured, the fastest algorithm at each measured
size. For a call of ``n`` bytes on ``p`` ranks, :meth:`Profile.choose` takes

- the measured winner at the measured size nearest to ``n`` (in log scale) when the study
  ran at ``p`` ranks: measurements beat a model wherever they exist;
- otherwise the algorithm the cost model (:mod:`.cost`) predicts fastest among those that
  say they may be chosen so (``chosen_by_model``: ring, tree, butterfly, hierarchical;
  ``mpi`` is modelled as the better of ring and butterfly, so it never wins on the model
  alone). A profile measured with ranks placed ``ranks_per_node`` to a node predicts for
  ``ceil(p / ranks_per_node)`` nodes; otherwise for one.

    from hpctrain.collectives import allreduce, auto
    auto.use(auto.load("runs/study-allreduce/params.json", comm))   # collective
    allreduce(grad, op="avg", algo="auto")

Every rank must choose the same algorithm for the same call: :func:`load` reads the file on
rank 0 and broadcasts it, so ranks agree even without a shared file system.

Where no profile was given (``HPCTRAIN_ALLREDUCE=auto`` on the launch line of a script that
never calls :func:`use`), ``hpctrain.torch.init`` loads :func:`profile_path`: the file
``$HPCTRAIN_ALLREDUCE_PROFILE`` names, else ``runs/study-allreduce/params.json`` (where
``hpctrain study allreduce`` writes by default).
"""

import bisect
import json
import math
import os
from dataclasses import dataclass, field

from . import cost
from .registry import ALGORITHMS
from ..errors import UsageError, Verdict

def never_chosen():
    """The algorithms ``auto`` never chooses, even where measured fastest (from the registry)."""
    return tuple(name for name, algorithm in ALGORITHMS.items() if not algorithm.chosen_by_auto)


def model_choices():
    """What the model may choose where nothing was measured, from the registry."""
    return tuple(name for name, algorithm in ALGORITHMS.items() if algorithm.chosen_by_model)

#: The variable that names the profile file, and the file where it names none.
ENV_PROFILE = "HPCTRAIN_ALLREDUCE_PROFILE"
DEFAULT_PROFILE = "runs/study-allreduce/params.json"


@dataclass(frozen=True)
class Profile:
    """Model parameters plus the measured winners: ``best[p] = ((size, algo), ...)``."""

    params: cost.Params
    switch_bytes: int = cost.DEFAULT_SWITCH_BYTES
    best: dict = field(default_factory=dict)
    source: str = ""
    ranks_per_node: int = 0

    @classmethod
    def from_dict(cls, data, source=""):
        """A profile from ``params.json``'s content; ``UsageError`` naming what is missing."""
        try:
            # A degenerate fit (no cost per byte) falls back to the ping-pong parameters.
            params = cost.params_of(data)
            best = {int(p): tuple(sorted((int(size), str(algo)) for size, algo in rows))
                    for p, rows in data.get("measured_best", {}).items()}
            return cls(params, int(data.get("switch_bytes", cost.DEFAULT_SWITCH_BYTES)), best,
                       source, int(data.get("ranks_per_node") or 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{source or 'profile'} is not an allreduce profile (the "
                             f"params.json of `hpctrain study allreduce`): {exc!r}") from None

    def choose(self, nbytes, ranks):
        """The algorithm for ``nbytes`` on ``ranks`` ranks (see the module docstring)."""
        rows = self.best.get(ranks)
        if rows:
            sizes = [size for size, _ in rows]
            i = bisect.bisect_left(sizes, nbytes)
            near = [j for j in (i - 1, i) if 0 <= j < len(rows)]
            j = min(near, key=lambda k: abs(math.log2(max(sizes[k], 1))
                                            - math.log2(max(nbytes, 1))))
            return rows[j][1]
        nodes = -(-ranks // self.ranks_per_node) if self.ranks_per_node else 1
        return min(model_choices(), key=lambda algo: cost.predict(
            algo, nbytes, ranks, self.params, nodes, switch_bytes=self.switch_bytes))


def measured_best(rows):
    """``{p: [[size, algo], ...]}``: the fastest algorithm (median call) per (ranks, size)
    in a study's rows (bench rows plus ``np``)."""
    winners = {}
    skipped = (*never_chosen(), "auto")
    for row in rows:
        if row["algo"] in skipped or row["size"] <= 0 \
                or row.get("wrong", 0) > 0:
            continue
        key = (row["np"], row["size"])
        if key not in winners or row["time_median_us"] < winners[key][1]:
            winners[key] = (row["algo"], row["time_median_us"])
    best = {}
    for (ranks, size), (algo, _) in sorted(winners.items()):
        best.setdefault(str(ranks), []).append([size, algo])
    return best


def load(path, comm=None):
    """The profile in ``path``, read by rank 0 of ``comm`` and broadcast (collective).

    A missing or malformed file raises the same ``Verdict`` on every rank.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    data = error = None
    if comm.rank == 0:
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            error = (f"allreduce 'auto': no profile at {str(path)!r}; write one with "
                     f"`hpctrain study allreduce --out DIR` and name DIR/params.json with "
                     f"{ENV_PROFILE}= (train: --allreduce-profile), or choose another "
                     f"algorithm")
        except (OSError, ValueError) as exc:
            error = f"allreduce 'auto': cannot read the profile {str(path)!r}: {exc}"
    data, error = comm.bcast((data, error), root=0)
    if error:
        raise Verdict.everywhere(error, comm)
    return Profile.from_dict(data, str(path))


def profile_path():
    """The profile file to load where none was given: ``$HPCTRAIN_ALLREDUCE_PROFILE``, else
    ``runs/study-allreduce/params.json``."""
    return os.environ.get(ENV_PROFILE) or DEFAULT_PROFILE


class Active:
    """The profile ``algo="auto"`` consults in this process (``None`` until :func:`use`),
    and ``name``, under which ``allreduce`` caches the plans of ``algo="auto"``:
    ``auto#<profiles given so far>``, new with every profile, so that plans chosen by an
    older one are never reused."""

    def __init__(self):
        self.profile = None
        self.given = 0
        self.name = "auto#0"


#: What ``algo="auto"`` uses now; the driver reads ``ACTIVE.name`` at every such call.
ACTIVE = Active()


def in_use():
    """True once :func:`use` gave this process a profile."""
    return ACTIVE.profile is not None


def use(profile):
    """Make ``profile`` the one ``algo="auto"`` consults (in this process)."""
    ACTIVE.profile = profile
    ACTIVE.given += 1
    ACTIVE.name = f"auto#{ACTIVE.given}"


def choice(nbytes, ranks):
    """``(algo, profile)`` for an ``auto`` call; ``UsageError`` if no profile is in use."""
    profile = ACTIVE.profile
    if profile is None:
        raise UsageError(f"algo='auto' needs a profile: call hpctrain.collectives.auto.use("
                         f"auto.load(PATH)) first, or start hpctrain.torch with {ENV_PROFILE} "
                         f"set (train: --allreduce-profile PATH)")
    return profile.choose(nbytes, ranks), profile
