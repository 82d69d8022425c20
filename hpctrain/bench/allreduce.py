"""``hpctrain bench allreduce``: allreduce's plug-in of the shared driver (:mod:`.driver`),
and what only its benchmark does (:class:`AllreduceExtras`).

Allreduce has no ``@interface``: its interface, ``collectives.Algorithm``, is the base of
every other, so its plug-in is declared here, and :data:`.blocks.PLUGINS` lists it first.
Beyond the driver, its benchmark

- times ``auto`` (the choice per size from a study's profile, ``--profile``) and says what
  it chose at each size;
- times, at the smallest size, a bare mpi4py Sendrecv between rank pairs beside the
  algorithms, in the same loop: the point-to-point floor a small allreduce is measured
  against (the footer's ratios, the JSON's ``sendrecv_reference``).

The timed loop runs with the collectives' argument-agreement check off, so that the times
are the algorithms' own; the correctness pass runs with it on. Imports no torch.
"""

from functools import partial

import numpy as np

from .. import collectives, tags
from ..collectives.bench_plugin import BenchCommand, BenchPlugin
from ..devices import synchronize
from ..errors import UsageError
from ..mpi import cuda as mpi_cuda
from .extras import Extras, chosen
from .sizes import format_size


def default_algos():
    """Every registered algorithm, Horovod last (its background thread starts on first use)."""
    return sorted(collectives.available(), key=lambda name: (name == "horovod", name))


def _call(check):
    def call(algo, send, recv, counts, args, comm):
        # Positional: cheaper to pass. The attribute is read here, at each run.
        return partial(collectives.allreduce, send, args.op, algo, comm, check)
    return call


class AllreduceExtras(Extras):
    """``auto`` and the Sendrecv reference (see the module docstring)."""

    def __init__(self):
        self.algos = ()
        self.awareness = None
        self.reference = None
        self.path = None

    def algorithms(self, collective, args):
        """Every registered name and ``auto``, which needs ``--profile``."""
        algos = chosen(collective, args.algos, [*sorted(collectives.ALGORITHMS), "auto"],
                       default_algos())
        if ("auto" in algos) != bool(getattr(args, "profile", None)):
            raise UsageError("--algos auto and --profile PARAMS_JSON go together (auto "
                             "chooses from the profile that `hpctrain study allreduce` writes)")
        self.algos = algos
        return algos

    def settings(self, args, comm, device):
        """MPI's CUDA-awareness, with ``--device cuda``.

        Asked once, before any device buffer reaches mpi4py: an MPI that cannot read device
        memory crashes on it (a segmentation fault, not an exception)."""
        if device.type != "cuda":
            return {}
        self.awareness = mpi_cuda.cuda_awareness(comm)
        return {"cuda_aware_mpi": str(self.awareness),
                "cuda_direct_bytes": collectives.buffers.direct_bytes()}

    def begin(self, args, comm):
        """Loads ``auto``'s profile (collective)."""
        if "auto" in self.algos:
            collectives.auto.use(collectives.auto.load(args.profile, comm))

    def beside(self, buf, comm, first):
        """The Sendrecv reference, at the smallest size (not an empty one)."""
        if not first or buf.numel() == 0:
            return {}
        self.path = sendrecv_path(buf, self.awareness)
        return {SENDRECV: sendrecv_call(buf, comm, self.path)}

    def measured(self, name, row):
        self.reference = {**row, "path": self.path}

    def closing(self, rows, ranks):
        """What ``auto`` chose (before the footer), the reference's ratios (after)."""
        before = auto_lines(rows, ranks)
        after = [] if self.reference is None else \
            reference_lines(rows, self.reference, ranks)
        return before, after

    def document(self):
        return {"sendrecv_reference": self.reference}


def auto_lines(rows, ranks):
    """Which algorithm ran in each row (``row["chose"]``: the row's own, or ``auto``'s
    choice at that size), and the line that says ``auto``'s; nothing without ``auto``."""
    if not any(row["algo"] == "auto" for row in rows):
        return []
    for row in rows:
        row["chose"] = collectives.auto.choice(row["size"], ranks)[0] \
            if row["algo"] == "auto" else row["algo"]
    return ["# auto chose: " + "  ".join(f"{format_size(row['size'])} {row['chose']}"
                                         for row in rows if row["algo"] == "auto")]


#: The name of the reference row (one bare Sendrecv per rank pair), and its messages' tag.
SENDRECV, SENDRECV_TAG = "sendrecv", tags.BENCH_SENDRECV


def _allreduce_call(buf, algo, op, comm):
    allreduce = collectives.allreduce
    return lambda: allreduce(buf, op, algo, comm, False)   # positional: cheaper to pass


def sendrecv_path(buf, awareness):
    """How the Sendrecv reference moves ``buf``: ``host`` (a host buffer), ``direct`` (device
    memory straight to a CUDA-aware MPI) or ``staged`` (through host memory).

    ``awareness`` is :func:`hpctrain.mpi.cuda.cuda_awareness`'s answer. Only a definite
    yes goes direct: an MPI that cannot read device memory crashes the process on it, while
    staging is only slower (the collectives decide the same way)."""
    if not getattr(buf, "is_cuda", False):
        return "host"
    return "direct" if awareness is not None and awareness.aware is True else "staged"


def sendrecv_call(buf, comm, path=None):
    """A call that swaps ``buf`` with a partner (``rank ^ 1``) in one mpi4py ``Sendrecv``;
    the last rank of an odd count has no partner and sends to itself. The same kind of call
    as the collectives' own messages, timed by the same loop: the point-to-point floor of a
    small allreduce. On ``comm`` itself: the collectives run on their own duplicate, and
    nothing else is in flight here.

    ``path`` (from :func:`sendrecv_path`; by default ``staged`` for a CUDA buffer, since
    whether MPI is CUDA-aware was not said): ``staged`` copies the device buffer into host
    memory, exchanges host buffers and copies the result back to the device, as the
    collectives' staged path does, so that it is compared with like; mpi4py is never given
    device memory then. The call's ``received`` is where the partner's data arrives (a
    transport view, on ``buf``'s device)."""
    peer = comm.rank ^ 1 if comm.rank ^ 1 < comm.size else comm.rank
    path = path or sendrecv_path(buf, None)
    flat = collectives.buffers.flatten(buf)[0]   # the transport view the collectives send
    synchronize(buf)
    sendrecv = comm.Sendrecv
    if path == "staged":
        return _staged_sendrecv(flat, peer, sendrecv)
    received = flat.clone() if buf.is_cuda else flat.copy()
    call = lambda: sendrecv(flat, peer, SENDRECV_TAG, received, peer, SENDRECV_TAG)  # noqa: E731
    call.received = received
    return call


def _staged_sendrecv(flat, peer, sendrecv):
    import torch

    # Page-locked host buffers, allocated once: the copies are DMA transfers, as in the
    # collectives' staging. A copy into pageable or page-locked host memory returns when it
    # is done, so MPI reads finished data.
    if isinstance(flat, np.ndarray):
        flat = torch.from_numpy(flat)   # a host tensor (tests): the same copies, unpinned
    pin = flat.is_cuda
    send = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=pin)
    recv = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=pin)
    send_np, recv_np = send.numpy(), recv.numpy()
    received = flat.clone()

    def call():
        send.copy_(flat)
        sendrecv(send_np, peer, SENDRECV_TAG, recv_np, peer, SENDRECV_TAG)
        received.copy_(recv)
    call.received = received
    return call


def reference_lines(rows, reference, ranks):
    """The footer's small-message comparison: each algorithm at the smallest size against
    ``ceil(lg p)`` bare Sendrecvs (the fewest messages any allreduce needs per rank).

    Medians (the slowest rank's median call), not means: at a few microseconds a mean is
    decided by the few calls that lost their core to another process."""
    steps = max(1, (ranks - 1).bit_length())   # ceil(lg p), and 1 for p = 1
    one = reference["time_median_us"]
    floor_us = steps * one
    size = reference["size"]
    lines = [f"# Small messages ({format_size(size)}): one bare mpi4py Sendrecv between rank "
             f"pairs takes {one:.2f} us (median call, same timing loop); "
             f"ceil(lg p) = {steps} of them: {floor_us:.2f} us"]
    if reference.get("path") == "staged":
        lines.append("#   Sendrecv staged through host memory (device -> host, Sendrecv, "
                     "host -> device): MPI is not known to be CUDA-aware")
    ratios = [f"{row['algo']} {row['time_median_us'] / floor_us:.2f}x" for row in rows
              if row["size"] == size and floor_us > 0]
    if ratios:
        lines.append("#   median time / (ceil(lg p) x Sendrecv): " + "  ".join(ratios))
    return lines



#: ``hpctrain bench allreduce``: one buffer, reduced in place on every rank.
PLUGIN = BenchPlugin(
    BenchCommand("every rank's vector reduced, the result on every rank",
                 "size is the whole vector; busbw = algbw*2(p-1)/p", op=True, smallest="8",
                 options=((("--profile",), {"metavar": "PARAMS_JSON", "help": "the profile "
                                            "for --algos auto: params.json of a study"}),)),
    sizes=lambda per, p: (per, None),
    call=_call(False),
    checked=_call(True),
    inputs=lambda per, rank, p, data: data.blocks(per, [rank]),
    result=lambda per, rank, p, args, data: data.reduced(per, args.op),
    bus_line="# busbw = algbw * 2(p-1)/p = algbw * {factor:.3f}; size: the whole vector, "
             "reduced in place on each of {ranks} ranks",
    blocks=False, bus=lambda p: 2 * (p - 1) / p, extras=AllreduceExtras)
