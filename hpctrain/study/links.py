"""Links as people buy them: a preset per generation, with the bus bandwidth an allreduce
reaches on it in practice and where that figure comes from, or any link as ``RATE[,LATENCY]``.

The cost model charges β = 1 / busbw per byte: nccl-tests' bus bandwidth of a large
allreduce, ``n/t · 2(p-1)/p``, is exactly the 1/β of the ring's ``2n(p-1)/p · β``, so a
measured busbw is the figure to give. A preset carries its line rate (one direction, what
the vendor sells), the busbw reached in practice with a low and a high (the band of ``study
plan --band``), a message latency and its source. A ``RATE[,LATENCY]`` is taken as measured:
the rate is the busbw, with no range. Here too: :func:`busbw`, and :func:`parse_rate`, a
link rate as people write it.
"""

import re
from dataclasses import dataclass, replace

from ..errors import UsageError

#: The message latency of a ``RATE`` given without one.
DEFAULT_LATENCY = 5e-6
#: The share of an RDMA network adapter's line rate an allreduce reaches (12 GB/s of a
#: 100 Gbit/s adapter's 12.5, 24 of a 200 Gbit/s one's 25: NVIDIA/nccl-tests#29, #119).
RDMA_SHARE = 0.96
#: The share NCCL reaches where TCP carries it: "not ... reliably more than 60% of wire speed
#: over 32Gbps networks" (NVIDIA/nccl#209, 2019; 9-42 % at 100 Gbit/s in NVIDIA/nccl#450).
TCP_SHARE = 0.6
#: The share of an NVLink's line rate that carries payload: ~20 of 25 GB/s per NVLink with the
#: 128-byte writes of the SMs (NVIDIA/nccl-tests#149).
NVLINK_SHARE = 0.8


@dataclass(frozen=True)
class Link:
    """A link: line rate and practical busbw (``low`` ≤ ``busbw`` ≤ ``high``) in bytes/s,
    message latency in s, and the source of the figures."""

    name: str
    line: float
    busbw: float
    low: float
    high: float
    latency: float
    source: str

    def at(self, end):
        """This link with its busbw at ``end``: ``"low"``, ``"high"`` or ``"point"``."""
        rate = {"low": self.low, "high": self.high}.get(end, self.busbw)
        return replace(self, busbw=rate, low=rate, high=rate)

    def describe(self):
        """``name: busbw (low-high) of line, latency``, in GB/s and µs."""
        spread = (f" ({self.low / 1e9:.3g}-{self.high / 1e9:.3g})"
                  if self.low != self.high else "")
        return (f"{self.name}: busbw {self.busbw / 1e9:.3g} GB/s{spread} of "
                f"{self.line / 1e9:.3g} line, {self.latency * 1e6:.3g} µs")


def _ethernet(gbit, latency):
    # Whether RDMA (RoCE) or TCP will carry it is what a buyer of Ethernet often does not know
    # yet: the range spans both, the value is its middle.
    line = gbit * 1e9 / 8
    return Link(f"{gbit}gbe", line, (RDMA_SHARE + TCP_SHARE) / 2 * line, TCP_SHARE * line,
                RDMA_SHARE * line, latency,
                f"{gbit} Gbit/s line; {RDMA_SHARE:.0%} with RDMA (RoCE) as NCCL reaches on an "
                f"RDMA adapter (NVIDIA/nccl-tests#29, #119), {TCP_SHARE:.0%} over TCP "
                f"(NVIDIA/nccl#209); the value the middle")


def _nvlink(gpu, links, per_link, measured=None, low=None, high=None, source=""):
    line = links * per_link
    busbw = measured or NVLINK_SHARE * line
    return Link(f"nvlink-{gpu}", line, busbw, low or 0.85 * busbw, high or busbw, 2e-6,
                f"{links} NVLinks x {per_link / 1e9:g} GB/s line per direction; {source}")


PRESETS = {link.name: link for link in [
    _nvlink("p100", 4, 20e9, source=f"busbw {NVLINK_SHARE:.0%} of line as payload "
            "(NVIDIA/nccl-tests#149), low end 85 % of it (assumed)"),
    _nvlink("v100", 6, 25e9, source=f"busbw {NVLINK_SHARE:.0%} of line as payload "
            "(NVIDIA/nccl-tests#149), low end 85 % of it (assumed)"),
    _nvlink("a100", 12, 25e9, measured=230e9, low=200e9,
            source="~230 GB/s busbw expected, ~200-208 GB/s reported by users "
                   "(NVIDIA/nccl-tests#149, #178)"),
    _nvlink("h100", 18, 25e9, measured=370e9, low=340e9, high=480e9,
            source="~370 GB/s busbw with the ring, ~480 GB/s with NVLink SHARP "
                   "(NVIDIA/nccl-tests#212); low end 340 (assumed)"),
    Link("pcie3", 15.75e9, 12e9, 10e9, 12e9, 5e-6,
         "PCIe 3.0 x16; ~12 GB/s measured into a V100 (ZaidQureshi/bam#54), low end 10 "
         "through the CPU's root complex (assumed)"),
    Link("pcie4", 31.5e9, 25e9, 21e9, 25e9, 5e-6,
         "PCIe 4.0 x16; 25 GB/s measured peak into an A100 (ZaidQureshi/bam#54), low end "
         "85 % of it (assumed)"),
    Link("pcie5", 63e9, 35e9, 28e9, 50e9, 5e-6,
         "PCIe 5.0 x16; allreduce busbw 35 GB/s on 4 and 28 on 8 GPUs, set by the CPU and "
         "memory (NVIDIA/nccl#1639); 50 = 80 % of line where the switch allows (assumed)"),
    _ethernet(10, 25e-6), _ethernet(25, 10e-6), _ethernet(40, 8e-6), _ethernet(50, 8e-6),
    _ethernet(100, 5e-6), _ethernet(200, 5e-6), _ethernet(400, 5e-6),
    Link("ib-edr", 12.5e9, 12e9, 11e9, 12.2e9, 1.5e-6,
         "InfiniBand EDR, 100 Gbit/s; 12.2 GB/s 'as good as you can get' per adapter "
         "(NVIDIA/nccl-tests#29), 12 the usual target (#119); low end 11 (assumed)"),
    Link("ib-hdr", 25e9, 24e9, 22e9, 24e9, 1.5e-6,
         "InfiniBand HDR, 200 Gbit/s; 24 GB/s per adapter (NVIDIA/nccl-tests#119, #252; "
         "192 GB/s over 8 on a DGX A100, NVIDIA/nccl#1576); low end 22 (assumed)"),
    Link("ib-ndr", 50e9, 48e9, 44e9, 48e9, 1.5e-6,
         "InfiniBand NDR, 400 Gbit/s; 48 GB/s = 96 % of line as EDR and HDR reach "
         "(derived), low end 44 (assumed)"),
]}

#: Earlier names, each the generation it stood for.
ALIASES = {"nvlink": "nvlink-v100", "pcie": "pcie3"}

#: Every name a preset answers to.
NAMES = (*ALIASES, *PRESETS)


def at_line(name):
    """The preset ``name`` at its nominal line rate (busbw, low and high all the line: what a
    simulated fabric's links are built from, :mod:`.fattree`); ``UsageError`` for an unknown
    name."""
    if name not in NAMES:
        raise UsageError(f"unknown link {name!r}; presets: {', '.join(NAMES)}")
    preset = PRESETS[ALIASES.get(name, name)]
    return replace(preset, busbw=preset.line, low=preset.line, high=preset.line)


def parse_latency(text):
    """Seconds in ``5us``, ``800ns``, ``1.5µs`` or ``2ms``; ``ValueError`` otherwise."""
    raw = text.strip().lower()
    for unit, scale in (("ns", 1e-9), ("us", 1e-6), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)):
        if raw.endswith(unit):
            value = float(raw[: -len(unit)])
            if value < 0:
                raise ValueError(text)
            return value * scale
    raise ValueError(text)


def link(text, option):
    """The :class:`Link` a preset name or ``RATE[,LATENCY]`` (``50gbit,5us``) stands for;
    ``UsageError`` naming ``option`` and a valid example otherwise."""
    name = ALIASES.get(text.strip().lower(), text.strip().lower())
    if name in PRESETS:
        return PRESETS[name]
    rate, _, latency = text.partition(",")
    try:
        busbw = parse_rate(rate)
        seconds = parse_latency(latency) if latency.strip() else DEFAULT_LATENCY
    except ValueError:
        raise UsageError(f"{option} {text!r}: give a preset ({', '.join(PRESETS)}) or "
                         f"RATE[,LATENCY], e.g. {option} 50gbit,5us or {option} "
                         f"42GB/s") from None
    return Link(text.strip(), busbw, busbw, busbw, busbw, seconds,
                "given: the rate taken as the busbw reached, no range")


def of_options(args):
    """``(intra, inter)``: the :class:`Link` of the options ``--intra`` and ``--inter``."""
    return link(args.intra, "--intra"), link(args.inter, "--inter")


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
