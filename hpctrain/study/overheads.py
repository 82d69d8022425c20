"""What communication still costs when backward hides it: the inputs of the terms a step at
p ranks pays besides computing and reducing, each with its stated uncertainty.

- **stragglers**: a synchronous step waits for the slowest of p ranks. With one rank's step
  spread as a normal law of relative standard deviation ``spread``, the expected slowest of
  p is ``compute · spread · E[max of p standard normals]`` later than the mean:
  0.56σ at p = 2, 2.6σ at 128, 3.0σ at 512 (:func:`expected_max`);
- **tail**: the update of the gradients whose reduction ends after backward (one rank
  updates each parameter as its gradient is ready, when the framework does so per
  parameter, as TensorFlow's apply ops do): ``update_s`` is the update of all parameters;
- **slowdown**: while a reduction runs beside backward, backward runs ``slowdown`` times
  slower (the reduction takes cores on a CPU, SMs and memory bandwidth on a GPU);
  ``slowdown_node`` where every reduction stays inside one node (over NVLink a reduction
  moves far more bytes through the GPU's memory than one paced by a network adapter);
- **negotiation**: the cost of agreeing on each tensor before its reduction, per tensor and
  cycle ``tensor_s`` plus ``rank_s`` per rank (a coordinator that gathers every rank's
  requests, as Horovod's without its cache, grows linearly with p);
- **framework**: the framework's own work per gradient and step at p > 1, beyond what one
  device's rate holds: DDP's hook and copies into and out of its buckets per parameter, ours
  the same, Horovod's besides its negotiation (``framework_ddp``, ``framework_hpctrain``,
  ``framework_horovod``, seconds per gradient: :meth:`Overheads.framework_at`). Fixed
  seconds per step, not a share of compute: a shorter step (mixed precision, a faster
  device) loses a larger share to it;
- **residual**: what a run measured at ``measured_p`` ranks (its efficiency, ``measured``)
  cost beyond every term above, carried to the other rank counts as a share of compute
  (:meth:`Overheads.solved` finds it). One measured scale cannot tell a cost that stays
  from one that grows like the stragglers', so the pessimistic end grows it as E[max of p]
  does, the optimistic end keeps it, and the value is halfway (:meth:`Overheads.residual_s`).
  Without a measurement, ``share``: a share of compute that runs of this kind lose and no
  term explains, the same at every p > 1 whose reductions leave the node (a default from
  published whole runs, :mod:`.defaults`); ``share_node`` where every reduction stays inside
  one node (over NVLink a reduction never crosses the host's PCIe, its CPU or a network
  adapter, where what the residual stands for happens: :meth:`Overheads.share_at`).

Every input is a :class:`Figure`: a value and its low and high.
"""

import math
from dataclasses import dataclass, field, fields, replace

import numpy as np

from ..errors import UsageError

#: The framework's own work per gradient, one input per gradient policy (:mod:`.step`).
FRAMEWORK_TERMS = ("framework_ddp", "framework_hpctrain", "framework_horovod")


@dataclass(frozen=True)
class Figure:
    """An input with its stated uncertainty: ``low`` ≤ ``value`` ≤ ``high``, and where it
    comes from."""

    value: float
    low: float
    high: float
    source: str = "given"

    @property
    def uncertain(self):
        """Whether the figure has a range."""
        return self.low != self.high

    def at(self, end):
        """The figure's value at ``end``: ``"low"``, ``"high"`` or ``"point"``."""
        return {"low": self.low, "high": self.high}.get(end, self.value)

    def describe(self, unit="", scale=1.0):
        """``value (low-high) unit``."""
        spread = f" ({_digits(self.low * scale)}-{_digits(self.high * scale)})" \
            if self.uncertain else ""
        return f"{_digits(self.value * scale)}{spread}{unit}"


def _digits(x):
    # Three significant digits, and whole numbers from 1000 up (not 1.27e+03).
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def exact(value, source="given"):
    """A :class:`Figure` without uncertainty."""
    return Figure(value, value, value, source)


def figure(text, option, example, minimum=0.0, source="given"):
    """The :class:`Figure` of ``VALUE`` or ``VALUE:LOW:HIGH``; ``UsageError`` naming
    ``option`` and ``example`` when it does not parse, is below ``minimum`` or out of order."""
    try:
        parts = [float(x) for x in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3 or not all(math.isfinite(x) for x in parts):
        raise UsageError(f"{option} {text!r}: give VALUE or VALUE:LOW:HIGH, e.g. "
                         f"{option} {example}")
    value, low, high = parts
    if min(parts) < minimum:
        raise UsageError(f"{option} {text!r}: must be at least {minimum:g}, e.g. "
                         f"{option} {example}")
    if not low <= value <= high:
        raise UsageError(f"{option} {text!r}: give VALUE:LOW:HIGH with LOW <= VALUE <= "
                         f"HIGH, e.g. {option} {example}")
    return Figure(value, low, high, source)


@dataclass(frozen=True)
class Overheads:
    """The inputs of the six terms (see the module's text); none by default.

    ``measured`` is an efficiency measured at ``measured_p`` ranks (0: none); ``residual``
    the share of compute it leaves beyond the other terms there, once :meth:`solved`;
    ``end`` which end of the band these inputs stand for (:meth:`at`)."""

    spread: Figure = field(default_factory=lambda: exact(0.0, "not given"))
    update_s: Figure = field(default_factory=lambda: exact(0.0, "not given"))
    slowdown: Figure = field(default_factory=lambda: exact(1.0, "not given"))
    slowdown_node: Figure = field(default_factory=lambda: exact(1.0, "not given"))
    tensor_s: Figure = field(default_factory=lambda: exact(0.0, "not given"))
    rank_s: Figure = field(default_factory=lambda: exact(0.0, "not given"))
    measured: Figure = field(default_factory=lambda: exact(0.0, "not given"))
    share: Figure = field(default_factory=lambda: exact(0.0, "not given"))
    share_node: Figure = field(default_factory=lambda: exact(0.0, "not given"))
    framework_ddp: Figure = field(default_factory=lambda: exact(0.0, "not given"))
    framework_hpctrain: Figure = field(default_factory=lambda: exact(0.0, "not given"))
    framework_horovod: Figure = field(default_factory=lambda: exact(0.0, "not given"))
    measured_p: int = 0
    residual: float = 0.0
    end: str = "point"

    def figure_names(self):
        """The names of the inputs that are :class:`Figure` s."""
        return [f.name for f in fields(self) if isinstance(getattr(self, f.name), Figure)]

    @property
    def calibrated(self):
        """Whether an efficiency measured at some scale is given."""
        return self.measured_p > 1 and self.measured.value > 0

    @property
    def uncertain(self):
        """Whether any input has a range (a measured efficiency always has one: how its
        residual grows with p)."""
        return self.calibrated or any(getattr(self, name).uncertain
                                      for name in self.figure_names())

    def at(self, end):
        """The inputs at the pessimistic (``"low"`` efficiency) or optimistic end."""
        # A low efficiency comes from each cost's high figure, and from the measured
        # efficiency's low one.
        flip = {"low": "high", "high": "low"}.get(end, end)
        return replace(self, end=end, **{
            name: exact(getattr(self, name).at(end if name == "measured" else flip))
            for name in self.figure_names()})

    def at_each(self, ends):
        """These inputs with each figure named in ``ends`` at that end of the band (``"low"``
        or ``"high"`` efficiency: a cost's high figure at the low end), the others at their
        value: how much one input alone widens the band."""
        flip = {"low": "high", "high": "low"}
        changed = {name: exact(getattr(self, name).at(
                       end if name == "measured" else flip.get(end, end)))
                   for name, end in ends.items() if name in self.figure_names()}
        return replace(self, end=ends.get("measured", self.end), **changed)

    def without(self, *names):
        """These inputs, the terms ``names`` switched off (their defaults: no cost)."""
        off = Overheads()
        return replace(self, **{name: replace(getattr(off, name), source="off")
                                for name in names})

    def solved(self, step_s, compute_s):
        """These inputs with :attr:`residual` set: the share of compute that makes a step
        predicted at :attr:`measured_p` without it (``step_s`` of which ``compute_s``
        computing) take the measured efficiency, compute / step; none where the prediction
        is already as slow."""
        if not self.calibrated:
            return self
        return replace(self, residual=max(0.0, 1.0 / self.measured.value - step_s / compute_s))

    def residual_s(self, compute_s, p, inside_node=False):
        """The residual's seconds at ``p`` ranks for a step computing ``compute_s``: the
        share :meth:`solved` found, as it was at the measured scale (the optimistic end),
        grown as the slowest of p is (E[max of p] over E[max of the measured p], the
        pessimistic end), or halfway (the value); 0 at one rank. Without a measurement,
        :meth:`share_at` of compute (``inside_node``: every reduction stays inside one
        node)."""
        if p < 2:
            return 0.0
        if not self.calibrated:
            return self.share_at(inside_node).value * compute_s
        grown = expected_max(p) / expected_max(self.measured_p)
        weight = {"low": max(1.0, grown), "high": min(1.0, grown)}.get(self.end,
                                                                       (1.0 + grown) / 2)
        return self.residual * compute_s * weight

    def share_at(self, inside_node):
        """The residual's share of compute without a measurement: :attr:`share_node` where
        every reduction stays inside one node, else :attr:`share`."""
        return self.share_node if inside_node else self.share

    def slowdown_at(self, nodes):
        """Backward's slowdown factor beside a reduction of a step over ``nodes`` nodes."""
        return (self.slowdown_node if nodes == 1 else self.slowdown).value

    def framework_at(self, policy):
        """The framework's own seconds per gradient and step under ``policy`` (``ddp``,
        ``hpctrain`` or ``horovod``)."""
        return getattr(self, f"framework_{policy}")

    def framework_s(self, gradients, p, policy):
        """Seconds a step of ``gradients`` gradients spends in the framework's own work at
        ``p`` ranks (0 at one rank: one device's rate holds what it does there)."""
        return self.framework_at(policy).value * gradients if p > 1 else 0.0

    def negotiation_s(self, tensors, p):
        """Seconds to agree on ``tensors`` tensors among ``p`` ranks (0 at one rank)."""
        if p < 2:
            return 0.0
        return tensors * (self.tensor_s.value + self.rank_s.value * p)


def expected_max(p):
    """E[max of ``p`` independent standard normals]: 0 at p = 1, 1/√π at 2, ~3.04 at 512.

    ``∫ x · p φ(x) Φ(x)^(p-1) dx``, on a grid fine enough for four digits."""
    from scipy import special   # here: SciPy's start-up is for the studies alone

    if p <= 1:
        return 0.0
    x = np.linspace(-8.0, 10.0, 20001)
    phi = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    density = p * phi * special.ndtr(x) ** (p - 1)
    return float(np.sum(x * density) * (x[1] - x[0]))
