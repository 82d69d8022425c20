"""A collective's benchmark, declared with its interface: what ``hpctrain bench <collective>``
needs of it (:class:`BenchPlugin`, its command line a :class:`BenchCommand`). The shared
driver (``hpctrain.bench.driver``) does the rest; declaring one imports no torch.

The block collectives count as nccl-tests does: ``size`` is the whole vector, cut into ``p``
equal blocks of ``count / p`` elements (``count`` rounded down to a multiple of ``p``), and
``busbw = algbw * (p-1)/p``: each rank receives the ``(p-1)/p`` of the vector that it does
not hold (:data:`SIZE_IN_BLOCKS`, :func:`blocks_bus_line`). A rooted collective moves the
whole vector from or to its root: ``busbw = algbw`` (nccl-tests' factor 1,
:data:`SIZE_WHOLE`), since every rank but the root receives or sends on all of it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

#: ``BenchCommand.size`` of a collective whose vector is cut into blocks, one per rank.
SIZE_IN_BLOCKS = "size is the whole vector (p equal blocks); busbw = algbw*(p-1)/p"
#: ``BenchCommand.size`` of a collective that moves the whole vector from or to a root.
SIZE_WHOLE = "size is the whole vector; busbw = algbw (nccl-tests' factor 1)"


def blocks_bus_line(vector):
    """``BenchPlugin.bus_line`` of a collective whose vector (``vector`` says which buffer
    it is) is cut into blocks."""
    return ("# busbw = algbw * (p-1)/p = algbw * {factor:.3f}; size: the whole vector "
            f"({vector}), {{ranks}} blocks of count/p elements")


class BenchCommand(NamedTuple):
    """The command line of one collective's benchmark, ``hpctrain bench <collective>``."""

    moves: str                # what the collective moves, for the one-line help
    size: str                 # what ``size`` is and how busbw is counted
    buffers: str = "buffers"  # what each algorithm is timed on
    op: bool = False          # takes -o
    root: str = ""            # the help of -r/--root, where it takes one
    smallest: str = "1K"      # -b's default
    options: tuple = ()       # more options: ((flags, argparse keywords), ...)


@dataclass(frozen=True)
class BenchPlugin:
    """What ``hpctrain bench`` needs of one collective, everything that differs from one
    collective's benchmark to the next: an interface's ``bench``. The shared driver
    (``hpctrain.bench.driver``) does the rest.

    The functions take ``per`` (one block's elements; a collective whose vector is not cut
    into blocks: the whole vector's), the ``rank`` and the number of ranks ``p``:

    - ``sizes(per, p)``: the elements of ``(send, recv)``; ``recv`` ``None``: in place;
    - ``call(algo, send, recv, counts, args, comm)``: a call of no arguments (``counts``:
      ``per`` for each rank; ``args``: the parsed command line, ``args.op``, ``args.root``);
    - ``inputs(per, rank, p, data)``: this rank's ``send`` for the correctness pass, made
      with ``data`` (the driver's ``Exact``: ``data.blocks(per, seeds)``, integers in
      [-3, 3], a different vector per seed; ``data.zeros(count)``);
    - ``result(per, rank, p, args, data)``: what ``recv`` must then hold, exactly
      (``data.reduced(count, op)``: every rank's ``data.blocks(count, [rank])`` reduced).

    and optionally ``checked``, the correctness pass's call where it is not ``call``
    (allreduce's, with the agreement check on), ``bus(p)``, busbw / algbw where
    :meth:`bus_factor`'s rule does not fit (allreduce: 2(p-1)/p), and ``extras``, the class
    of what the benchmark does beyond the driver (``hpctrain.bench.extras.Extras``).

    Its functions make their data through ``data``, so that declaring one imports no torch:
    the command line is built from the plug-ins before parsing.
    """

    command: BenchCommand
    sizes: Callable
    call: Callable
    inputs: Callable
    result: Callable
    bus_line: str             # "# busbw = ..." with {factor}, {ranks} and {root} to fill
    blocks: bool = True       # the vector is cut into p blocks (not broadcast, reduce)
    checked: Callable = None
    bus: Callable = None
    extras: Callable = None

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
        if self.bus is not None:
            return self.bus(ranks)
        return (ranks - 1) / ranks if self.blocks else 1.0
