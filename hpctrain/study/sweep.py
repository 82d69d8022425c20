"""What every study shares: the rank counts it sweeps, its progress lines, its report's header."""

from .. import units
from ..errors import UsageError


def rank_counts(text, minimum=1, option="--np"):
    """``"4,2,2"`` → ``[2, 4]``: the distinct rank counts of ``option``, sorted.

    ``UsageError`` for anything but comma-separated integers, or a count below ``minimum``.
    """
    try:
        counts = sorted({units.number(part) for part in text.split(",")})
    except ValueError:
        raise UsageError(f"{option} takes rank counts like 2,3,4, got {text!r}") from None
    if counts[0] < minimum:
        raise UsageError(f"{option} rank counts must be >= {minimum}, got {text!r}")
    return counts


def machine_lines(cores, env, ranks):
    """The report's first lines: cores, versions, and which of ``ranks`` oversubscribe."""
    over = [p for p in ranks if p > cores]
    return [f"- machine: {cores} cores; hpctrain {env['versions']['hpctrain']}, {env['mpi']}",
            f"- oversubscribed points (more ranks than cores, marked *): p = "
            f"{', '.join(map(str, over)) or 'none'}. Their ranks wait for a core, so they "
            "measure contention, not what p cores would do."]


def say(text):
    """One progress line of the study on stdout."""
    print(f"[study] {text}", flush=True)
