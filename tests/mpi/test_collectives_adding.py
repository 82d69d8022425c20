"""Adding a collective touches what docs/collectives.md says, and nothing else: under mpirun,
``mpirun -np N python -m pytest --with-mpi tests/mpi/test_collectives_adding.py``.

A toy ``gather`` (every rank's block to a root) is written here as a new collective would be
written in the package: one module holding its interface (``@interface``: registry, default
algorithm, bench plug-in) and its call, as ``collectives/reduce_call.py`` holds reduce's, and one
module per algorithm (``linear``, ``mpi``), as ``reduce_tree.py`` and ``reduce_mpi.py``.
Importing the algorithm modules stands for the import line in ``collectives/__init__.py``.
Nothing else is edited, yet the registry, ``available``, ``companion``, ``hpctrain bench
gather`` (its command line, the shared driver, the exact check) all find it.
"""

import importlib
import sys
import textwrap
from functools import partial

import numpy as np
import pytest
from mpi4py import MPI

from conftest import all_ranks
from hpctrain import collectives
from hpctrain.bench import driver
from hpctrain.bench.blocks import PLUGINS
from hpctrain.cli import build_parser
from hpctrain.collectives import REGISTRIES, available, companion
from hpctrain.collectives.registry import INTERFACES

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
SIZE, RANK = COMM.Get_size(), COMM.Get_rank()
_all_ranks = partial(all_ranks, COMM)

#: The new collective's files, as a newcomer would write them in hpctrain/collectives/.
TOY = {
    "toy_gather.py": '''
        """gather: every rank's block to the root (the interface and the call)."""

        from functools import partial

        from hpctrain.collectives.algorithm import Algorithm
        from hpctrain.collectives.arguments import (block_bounds, byte_views, expect_length,
                                                    rank_of)
        from hpctrain.collectives.bench_plugin import BenchCommand, BenchPlugin
        from hpctrain.collectives.buffers import execute
        from hpctrain.collectives.contexts import context, shape
        from hpctrain.collectives.dtypes import BYTES
        from hpctrain.collectives.registry import interface, lookup


        @interface
        class GatherAlgorithm(Algorithm):
            """run(comm, send, recv, bounds, root): recv is None off the root."""

            collective = "gather"
            default = "linear"
            bench = BenchPlugin(
                BenchCommand("every rank's block to root", "size is the whole vector",
                             root="the rank that gathers"),
                sizes=lambda per, p: (per, per * p),
                call=lambda algo, send, recv, counts, args, comm: partial(
                    gather, send, recv, counts, args.root, algo, comm),
                inputs=lambda per, rank, p, data: data.blocks(per, [rank]),
                result=lambda per, rank, p, args, data: data.blocks(per, range(p))
                if rank == args.root else data.zeros(per * p),
                bus_line="# busbw = algbw * {factor:.3f}; to root {root} of {ranks}")

            def run(self, comm, send, recv, bounds, root):
                raise NotImplementedError


        def gather(send, recv, counts, root=0, algo=GatherAlgorithm.default, comm=None):
            """Rank r's send at block r of the root's recv; recv untouched elsewhere."""
            size, rank = shape(comm)
            algorithm, root = lookup("gather", algo), rank_of("gather", root, size)
            bounds = block_bounds(counts, size, "gather", "counts")
            (send_bytes, recv_bytes), itemsize, device = byte_views("gather", send, recv)
            for name, buf, want in (("send", send, counts[rank]), ("recv", recv, bounds[-1])):
                expect_length("gather", name, buf, want, f"its count, {want}")
            if bounds[-1] == 0:
                return recv     # the same counts on every rank
            ctx = context(comm)   # collective on first use: after the checks
            scaled = tuple(b * itemsize for b in bounds)

            def bind(on_device):
                return lambda s, r=None: algorithm.run(ctx.comm, s, r, scaled, root)
            outputs = (recv_bytes,) if rank == root else ()
            execute(ctx, algorithm, BYTES, device, (send_bytes,), outputs, bind)
            return recv
        ''',
    "toy_gather_linear.py": '''
        """Linear gather: the root receives each block in turn."""

        from hpctrain.collectives.algorithm import place
        from hpctrain.collectives.registry import register
        from toy_gather import GatherAlgorithm


        @register
        class LinearGather(GatherAlgorithm):
            name = "linear"

            def run(self, comm, send, recv, bounds, root):
                rank = comm.Get_rank()
                if rank != root:
                    comm.Send(send, dest=root, tag=self.tag)
                    return
                place(recv[bounds[rank]:bounds[rank + 1]], send)
                for peer in range(comm.Get_size()):
                    if peer != root:
                        comm.Recv(recv[bounds[peer]:bounds[peer + 1]], source=peer,
                                  tag=self.tag)
        ''',
    "toy_gather_mpi.py": '''
        """The MPI library's gather."""

        from hpctrain.collectives.algorithm import block_layout
        from hpctrain.collectives.registry import register
        from toy_gather import GatherAlgorithm


        @register
        class MpiGather(GatherAlgorithm):
            name = "mpi"

            def run(self, comm, send, recv, bounds, root):
                from mpi4py import MPI

                layout = None if recv is None else [recv, *block_layout(bounds), MPI.BYTE]
                comm.Gatherv([send, MPI.BYTE], layout, root=root)
        ''',
}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy collective, declared and registered on every rank in the same order (the
    tags), and taken out of the registries afterwards."""
    folder = tmp_path_factory.mktemp(f"toy-rank{RANK}")
    for name, text in TOY.items():
        (folder / name).write_text(textwrap.dedent(text))
    sys.path.insert(0, str(folder))
    try:
        # The import line a new collective adds to collectives/__init__.py.
        for name in ("toy_gather_linear", "toy_gather_mpi"):
            importlib.import_module(name)
        yield sys.modules["toy_gather"]
    finally:
        sys.path.remove(str(folder))
        for name in TOY:
            sys.modules.pop(name.removesuffix(".py"), None)
        REGISTRIES.pop("gather", None)
        INTERFACES.pop("gather", None)


def test_the_new_collective_is_found_by_every_generic_path(toy):
    assert available("gather") == ["linear", "mpi"]
    assert collectives.COLLECTIVES[-1] == "gather"
    assert [companion("gather", a) for a in ("mpi", "ring", "tree")] == \
        ["mpi", "linear", "linear"]
    assert PLUGINS["gather"] is toy.GatherAlgorithm.bench and list(PLUGINS)[-1] == "gather"
    args = build_parser().parse_args(["bench", "gather", "--root", "1"])
    assert (args.collective, args.root) == ("gather", 1)
    taken = [t for registry in REGISTRIES.values() for a in registry.values()
             for t in range(a.tag, a.tag + a.tags)]
    assert len(set(taken)) == len(taken)


@pytest.mark.parametrize("algo", ["linear", "mpi"])
def test_the_new_collective_gathers_exactly_to_every_root(toy, algo):
    counts = [(3, 0, 7, 1)[r % 4] + r for r in range(SIZE)]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    want = np.concatenate([np.arange(c, dtype=np.int64) * 10 + r for r, c in enumerate(counts)])
    ok = True
    for root in range(SIZE):
        send = want[offsets[RANK]:offsets[RANK + 1]].copy()
        recv = np.full(offsets[-1], -1, dtype=np.int64)
        toy.gather(send, recv, counts, root=root, algo=algo)
        ok &= np.array_equal(recv, want if RANK == root else np.full_like(want, -1))
    _all_ranks(ok)


def test_the_new_collective_is_benchmarked_and_checked_by_the_shared_driver(toy, capsys):
    root = SIZE - 1
    args = build_parser().parse_args(["bench", "gather", "--root", str(root), "-b", "96",
                                      "-e", "6K", "-f", "8", "-n", "2", "-w", "1"])
    wrong = driver.run("gather", args, COMM)
    out = capsys.readouterr().out
    _all_ranks(wrong == 0, [f"{wrong} wrong values"])
    if RANK == 0:
        assert "bench gather" in out and f" root {root}" in out, out
        assert f"to root {root} of {SIZE}" in out, out
        rows = [line.split() for line in out.splitlines() if line and line[0] != "#"]
        # 96 B, 768 B, 6 KiB of float32 in p blocks of count/p elements, each algorithm.
        sizes = [4 * (n // 4 // SIZE) * SIZE for n in (96, 768, 6144)]
        assert [(int(r[0]), r[4], r[-1]) for r in rows] == \
            [(n, algo, "0") for n in sizes for algo in ("linear", "mpi")], out
        assert "# Out of bounds values : 0 OK" in out
