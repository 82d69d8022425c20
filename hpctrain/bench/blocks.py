"""The collectives ``hpctrain bench`` times beside allreduce, one plug-in each, as
nccl-tests times these collectives: allgather, reducescatter, alltoall, broadcast, reduce.

A plug-in, an entry of :data:`PLUGINS`, is everything that differs from one collective's
benchmark to the next: its command line, its buffers, its call, its correctness input and
exact result, its busbw line. The driver (:mod:`.driver`) runs any of them on the allreduce
benchmark's pieces: the same ``#`` header, timing loop (warm-up, algorithms taking turns in
rotated rounds, :func:`.allreduce.time_calls`), columns, correctness pass, footer and
JSON/HDF5 outputs. A new collective is one entry here and nothing else in ``bench``.

This module imports no torch: the command line (``cli``) is built from :data:`PLUGINS`
before parsing, and the plug-ins make their data through the object the driver hands them
(:class:`.driver.Exact`).

The blocks are equal: ``count`` elements in all, ``count / p`` per rank (``count`` rounded
down to a multiple of ``p``, as nccl-tests does); broadcast and reduce move the whole
``count`` from or to ``--root``.

``size`` is the whole vector's bytes: allgather's output, reduce-scatter's input,
alltoall's input on each rank, broadcast's buffer, reduce's input. ``busbw = algbw *
(p-1)/p`` for the first three (nccl-tests' factor): each rank receives the ``(p-1)/p`` of
the vector that it does not hold; ``busbw = algbw`` for broadcast and reduce (nccl-tests'
factor 1): every rank but the root receives (broadcast) or sends on (reduce) the whole
vector.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from .. import collectives


class Command(NamedTuple):
    """The command line of one collective's benchmark, for ``cli``."""

    moves: str                # what the collective moves, for the one-line help
    size: str                 # what ``size`` is and how busbw is counted
    buffers: str = "buffers"  # what each algorithm is timed on
    op: bool = False          # takes -o
    root: str = ""            # the help of -r/--root, where it takes one


@dataclass(frozen=True)
class Plugin:
    """One collective for the shared driver: everything that differs from one to the next.

    The functions take ``per`` (one block's elements; broadcast and reduce: the whole
    vector's), the ``rank`` and the number of ranks ``p``:

    - ``sizes(per, p)``: the elements of ``(send, recv)``; ``recv`` ``None``: in place;
    - ``call(algo, send, recv, counts, args, comm)``: a call of no arguments (``counts``:
      ``per`` for each rank);
    - ``inputs(per, rank, p, data)``: this rank's ``send`` for the correctness pass, made
      with ``data`` (:class:`.driver.Exact`: ``data.blocks(per, seeds)``, integers in
      [-3, 3], a different vector per seed);
    - ``result(per, rank, p, args, data)``: what ``recv`` must then hold, exactly
      (``data.reduced(count, op)``: every rank's ``data.blocks(count, [rank])`` reduced).
    """

    command: Command
    sizes: Callable
    call: Callable
    inputs: Callable
    result: Callable
    bus_line: str             # "# busbw = ..." with {factor}, {ranks} and {root} to fill
    blocks: bool = True       # the vector is cut into p blocks (not broadcast, reduce)

    @property
    def reduces(self):
        """It takes an op (``-o``)."""
        return self.command.op

    @property
    def rooted(self):
        """It takes a root (``--root``)."""
        return bool(self.command.root)

    def parts(self, ranks):
        """How many equal parts ``count`` is cut into (``per`` elements each)."""
        return ranks if self.blocks else 1

    def bus_factor(self, ranks):
        """nccl-tests' busbw / algbw: (p-1)/p, the share of the vector each rank receives,
        where the vector is cut into blocks; 1 where the whole vector crosses a link."""
        return (ranks - 1) / ranks if self.blocks else 1.0


_BLOCKS = "size is the whole vector (p equal blocks); busbw = algbw*(p-1)/p"
_WHOLE = "size is the whole vector; busbw = algbw (nccl-tests' factor 1)"


def _blocks_line(vector):
    return ("# busbw = algbw * (p-1)/p = algbw * {factor:.3f}; size: the whole vector "
            f"({vector}), {{ranks}} blocks of count/p elements")


def _rooted_result(per, rank, args, data):
    """reduce's ``recv``: the reduced vector on the root; elsewhere the zeros it was made
    with, untouched."""
    return data.reduced(per, args.op) if rank == args.root else data.zeros(per)


#: The collectives ``bench`` times beside allreduce, by their command and REGISTRIES name,
#: in the help's order.
PLUGINS = {
    "allgather": Plugin(
        Command("every rank's block to every rank", _BLOCKS),
        sizes=lambda per, p: (per, per * p),
        call=lambda algo, send, recv, counts, args, comm: partial(
            collectives.allgather, send, recv, counts, algo, comm),
        inputs=lambda per, rank, p, data: data.blocks(per, [rank]),
        result=lambda per, rank, p, args, data: data.blocks(per, range(p)),
        bus_line=_blocks_line("recv")),
    "reducescatter": Plugin(
        Command("reduce, each rank keeping its block", _BLOCKS, op=True),
        sizes=lambda per, p: (per * p, per),
        call=lambda algo, send, recv, counts, args, comm: partial(
            collectives.reduce_scatter, send, recv, counts, args.op, algo, comm),
        inputs=lambda per, rank, p, data: data.blocks(per * p, [rank]),
        result=lambda per, rank, p, args, data:
            data.reduced(per * p, args.op)[rank * per:(rank + 1) * per],
        bus_line=_blocks_line("send")),
    # The block rank i sends rank j is data.blocks(per, [i * p + j]).
    "alltoall": Plugin(
        Command("block j of every rank to rank j", _BLOCKS),
        sizes=lambda per, p: (per * p, per * p),
        call=lambda algo, send, recv, counts, args, comm: partial(
            collectives.alltoall, send, counts, recv, counts, algo, comm),
        inputs=lambda per, rank, p, data: data.blocks(per, (rank * p + j for j in range(p))),
        result=lambda per, rank, p, args, data:
            data.blocks(per, (i * p + rank for i in range(p))),
        bus_line=_blocks_line("send, on each rank")),
    "broadcast": Plugin(
        Command("root's vector to every rank", _WHOLE, buffers="buffer",
                root="the rank whose vector is broadcast"),
        sizes=lambda per, p: (per, None),
        call=lambda algo, send, recv, counts, args, comm: partial(
            collectives.broadcast, send, args.root, algo, comm),
        inputs=lambda per, rank, p, data: data.blocks(per, [rank]),
        result=lambda per, rank, p, args, data: data.blocks(per, [args.root]),
        bus_line="# busbw = algbw (factor 1, as nccl-tests' broadcast); size: the whole "
                 "vector, from root {root}",
        blocks=False),
    # Every rank has a recv, as in nccl-tests; off the root it must come back untouched.
    "reduce": Plugin(
        Command("every rank's vector reduced into root's", _WHOLE, op=True,
                root="the rank that receives the result"),
        sizes=lambda per, p: (per, per),
        call=lambda algo, send, recv, counts, args, comm: partial(
            collectives.reduce, send, recv, args.op, args.root, algo, comm),
        inputs=lambda per, rank, p, data: data.blocks(per, [rank]),
        result=lambda per, rank, p, args, data: _rooted_result(per, rank, args, data),
        bus_line="# busbw = algbw (factor 1, as nccl-tests' reduce); size: the whole "
                 "vector, to root {root}",
        blocks=False),
}
