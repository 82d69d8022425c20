"""One rule for a wait that some ranks have not joined, and one way to say it.

Two watchers apply it, each where only it can see the waits: the communication engine of
``hpctrain.torch`` (:class:`hpctrain.torch.engine.StallInspector`: negotiated operations, every
rank seeing the same table) and the watchdog of ``hpctrain train``
(:class:`hpctrain.watchdog.StallWatchdog`: plain MPI collectives, arrivals sent to rank 0).

    rule = StallRule(warn_s=60, give_up_s=None)
    if rule.give_up(waited): ...                   # past give_up_s: end it (stateless)
    if rule.warn(key, waited): log(stalled(...))   # past warn_s: once per wait
    rule.settled(key)                              # it ran: forget it
"""


class StallRule:
    """Warn once per wait past ``warn_s`` seconds, give up past ``give_up_s`` (``0`` or
    ``None``: never). ``give_up`` keeps no state, so ranks that feed it the same waits (rank
    0's clock, say) decide alike; ``warn`` remembers what it has said."""

    def __init__(self, warn_s, give_up_s=None):
        self.warn_s, self.give_up_s = warn_s, give_up_s
        self._warned = set()

    def warn(self, key, waited):
        """True the first time ``key`` has waited ``warn_s`` or longer."""
        if not self.warn_s or waited < self.warn_s or key in self._warned:
            return False
        self._warned.add(key)
        return True

    def give_up(self, waited):
        """True once a wait has lasted ``give_up_s``."""
        return bool(self.give_up_s) and waited >= self.give_up_s

    def settled(self, key):
        """``key`` ran or failed: forget it."""
        self._warned.discard(key)


def stalled(label, waited, missing, verb):
    """The one wording: ``stall: LABEL has waited N s for rank(s) [..], which have not VERB``."""
    return (f"stall: {label} has waited {waited:.0f} s for rank(s) {sorted(missing)}, which "
            f"have not {verb}")
