"""The allreduce core without MPI: chunking, validation, registry, buffers, reductions.

The schedules, run over an in-memory communicator, are in test_collectives_schedules.py.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpctrain.collectives import (ALGORITHMS, DTYPES, OPS, REGISTRIES, Algorithm, available,
                                  companion)
from hpctrain.collectives import algorithm, buffers
from hpctrain.collectives.allgather_call import AllgatherAlgorithm
from hpctrain.collectives.check import algorithm_code
# By its path: the package's attribute ``reduce`` is the collective, not this module.
from hpctrain.collectives.kernels import averager, host_reducer
from hpctrain.collectives.registry import FIRST_TAG, INTERFACES, interface, register
from hpctrain.errors import UsageError


# ----- chunking -------------------------------------------------------------------------------

@given(count=st.integers(0, 10_000), parts=st.integers(1, 64))
def test_chunks_cover_everything_and_differ_by_at_most_one(count, parts):
    bounds = algorithm.chunk_bounds(count, parts)
    sizes = np.diff(bounds)
    assert len(bounds) == parts + 1 and bounds[0] == 0 and bounds[-1] == count
    assert sizes.min() >= 0 and sizes.max() - sizes.min() <= 1
    assert list(sizes) == sorted(sizes, reverse=True)   # the larger chunks come first


def test_chunk_bounds_examples():
    assert algorithm.chunk_bounds(10, 3) == (0, 4, 7, 10)
    assert algorithm.chunk_bounds(2, 4) == (0, 1, 2, 2, 2)
    assert algorithm.chunk_bounds(0, 2) == (0, 0, 0)


# ----- validation ---------------------------------------------------------------------------

def test_unknown_options_list_the_valid_ones():
    with pytest.raises(UsageError, match="takes no option 'root'; its options: none"):
        ALGORITHMS["mpi"].parameters(4, {"root": 0})
    with pytest.raises(UsageError, match="its options: root"):
        ALGORITHMS["tree"].parameters(4, {"servers": 2})


@pytest.mark.parametrize("algo, options, message", [
    ("tree", {"root": 4}, "valid values are 0 to 3"),
    ("ps", {"root": -1}, "valid values are 0 to 3"),
    ("ps-sharded", {"servers": 5}, "valid values are 1 to 4"),
    ("ps-sharded", {"servers": 0}, "valid values are 1 to 4"),
    ("butterfly", {"switch_bytes": -1}, "must be >= 0"),
    ("tree", {"root": 1.5}, "must be an integer"),
    ("tree", {"root": True}, "must be an integer"),
])
def test_option_values_are_checked(algo, options, message):
    with pytest.raises(UsageError, match=message):
        ALGORITHMS[algo].parameters(4, options)


def test_option_defaults():
    assert ALGORITHMS["tree"].parameters(4, {}) == (0,)
    assert ALGORITHMS["ps-sharded"].parameters(4, {}) == (4,)
    assert ALGORITHMS["butterfly"].parameters(4, {}) == (64 * 1024,)
    assert ALGORITHMS["ps"].parameters(3, {"root": np.int64(2)}) == (2,)


def test_non_contiguous_buffers_name_the_fix():
    with pytest.raises(UsageError, match=r"np\.ascontiguousarray"):
        buffers.flatten(np.ones((4, 4))[:, 0])
    with pytest.raises(UsageError, match=r"\.contiguous\(\)"):
        buffers.flatten(torch.ones(4, 4).t())


@pytest.mark.parametrize("buf", [np.ones(3, dtype=np.uint8), np.ones(3, dtype=np.complex64),
                                 torch.ones(3, dtype=torch.uint8), np.ones(3, dtype=">f4")])
def test_unsupported_dtypes_list_the_valid_ones(buf):
    with pytest.raises(UsageError, match="valid choices: bfloat16, float16, float32, float64, "
                                         "int32, int64"):
        buffers.flatten(buf)


def test_other_buffers_are_rejected():
    with pytest.raises(UsageError, match="NumPy array or a torch tensor, got list"):
        buffers.flatten([1.0, 2.0])
    readonly = np.ones(3)
    readonly.flags.writeable = False
    with pytest.raises(UsageError, match="read-only"):
        buffers.flatten(readonly)


def test_flatten_is_a_view_and_halves_travel_as_int16():
    array = np.ones((2, 3), dtype=np.float16)
    flat, dtype, device = buffers.flatten(array)
    assert flat.dtype == np.int16 and flat.shape == (6,) and dtype.name == "float16"
    assert np.shares_memory(flat, array) and device is None
    tensor = torch.ones(2, 2, dtype=torch.bfloat16)
    flat, dtype, _ = buffers.flatten(tensor)
    assert flat.dtype == np.int16 and dtype.name == "bfloat16"
    flat[0] = 0
    assert tensor[0, 0] == 0


# ----- registry -----------------------------------------------------------------------------

def test_every_algorithm_module_registers_its_algorithm():
    import importlib
    import pkgutil

    import hpctrain.collectives as package

    defined = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        defined |= {(obj.collective, obj.name) for obj in vars(module).values()
                    if isinstance(obj, type) and issubclass(obj, Algorithm) and obj.name
                    and obj.__module__ == module.__name__}
    registered = {(collective, name) for collective, registry in REGISTRIES.items()
                  for name in registry}
    assert defined == registered and ("allreduce", "hierarchical") in defined
    assert {name for collective, name in defined if collective == "allreduce"} == \
        set(ALGORITHMS)
    for collective, registry in REGISTRIES.items():
        assert all(isinstance(a, Algorithm) and a.name == name and a.collective == collective
                   for name, a in registry.items())
    assert set(available()) <= set(ALGORITHMS) and "ring" in available()
    assert available("allgather") == ["butterfly", "mpi", "ring"]
    assert available("reducescatter") == ["butterfly", "mpi", "ring"]
    assert available("alltoall") == ["mpi", "pairwise"]
    assert available("broadcast") == ["mpi", "scatter_allgather", "tree"]
    assert available("reduce") == ["mpi", "tree"]
    assert set(DTYPES) == {"float16", "bfloat16", "float32", "float64", "int32", "int64"}
    assert set(OPS) == {"sum", "avg", "min", "max", "prod"}


def test_the_registry_gives_every_algorithm_tags_of_its_own():
    # Of every collective: the allgather ring's messages never match the allreduce ring's.
    taken = [t for registry in REGISTRIES.values() for a in registry.values()
             for t in range(a.tag, a.tag + a.tags)]
    assert len(set(taken)) == len(taken) and min(taken) == FIRST_TAG
    assert ALGORITHMS["ps"].tags == ALGORITHMS["ps-sharded"].tags == 2   # results: tag + 1


def test_the_fixed_tags_are_distinct_and_above_every_tag_the_registries_reach():
    from hpctrain import tags

    taken = [t for registry in REGISTRIES.values() for a in registry.values()
             for t in range(a.tag, a.tag + a.tags)]
    assert max(taken) < tags.ALGORITHM_TAGS_END
    fixed = [value for name, value in vars(tags).items()
             if name.isupper() and name not in ("FIRST_ALGORITHM_TAG", "ALGORITHM_TAGS_END")]
    assert len(fixed) >= 9 and len(set(fixed)) == len(fixed)
    assert all(tags.ALGORITHM_TAGS_END < t <= 32767 for t in fixed)


def test_a_second_registration_of_a_name_is_refused():
    class Again(Algorithm):
        name = "ring"

    with pytest.raises(ValueError, match="registered twice"):
        register(Again)

    class Same(AllgatherAlgorithm):
        name = "ring"

    with pytest.raises(ValueError, match="allgather algorithm 'ring' registered twice"):
        register(Same)


def test_a_collective_is_declared_once_by_its_interface_before_its_algorithms():
    class Stray(Algorithm):
        collective = "scan"
        name = "linear"

    with pytest.raises(ValueError, match="'scan' is not a collective: declare its interface "
                                         "with @interface"):
        register(Stray)

    class Again(Algorithm):
        collective = "reduce"
        default = "tree"

    with pytest.raises(ValueError, match="collective 'reduce' declared twice"):
        interface(Again)

    class NoDefault(Algorithm):
        collective = "scan"

    with pytest.raises(ValueError, match="'scan' names no default algorithm"):
        interface(NoDefault)
    assert "scan" not in REGISTRIES and "scan" not in INTERFACES
    import hpctrain.collectives as package

    assert package.COLLECTIVES == \
        ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce")


def test_a_collective_is_named_only_by_its_interface_its_call_and_its_algorithms():
    # docs/collectives.md's worked example: a new collective touches its own module,
    # collectives/<collective>_call.py (interface, bench plug-in, call), one module per
    # algorithm and collectives/__init__.py. The interface, the registries, the benchmark and
    # the calls' shared checks read the interfaces: no name of a collective in them.
    from pathlib import Path

    import hpctrain

    root = Path(hpctrain.__file__).parent
    generic = [root / "collectives" / f"{name}.py"
               for name in ("algorithm", "registry", "bench_plugin", "arguments")]
    generic += sorted((root / "bench").glob("*.py"))
    for collective, declared in INTERFACES.items():
        assert declared.__module__ == f"hpctrain.collectives.{collective}_call", collective
        assert declared.bench is not None and declared.default in REGISTRIES[collective]
        for path in generic:
            text = path.read_text()
            assert f'"{collective}"' not in text and f"'{collective}'" not in text, \
                (collective, path.name)
        assert {type(a).__module__.rpartition(".")[2].split("_")[0]
                for a in REGISTRIES[collective].values()} == {collective}


@pytest.mark.parametrize("allreduce_algo, gather, scatter, exchange, bcast, to_root", [
    ("ring", "ring", "ring", "pairwise", "scatter_allgather", "tree"),
    ("butterfly", "butterfly", "butterfly", "pairwise", "scatter_allgather", "tree"),
    ("mpi", "mpi", "mpi", "mpi", "mpi", "mpi"),
    ("hierarchical", "ring", "ring", "pairwise", "tree", "tree"),
    ("tree", "ring", "ring", "pairwise", "tree", "tree"),
    ("ps", "ring", "ring", "pairwise", "tree", "tree"),
    ("ps-sharded", "ring", "ring", "pairwise", "tree", "tree"),
    ("auto", "ring", "ring", "pairwise", "tree", "tree"),
    ("horovod", "ring", "ring", "pairwise", "tree", "tree")])
def test_the_companion_of_each_allreduce_algorithm(allreduce_algo, gather, scatter, exchange,
                                                   bcast, to_root):
    assert [companion(c, allreduce_algo)
            for c in ("allgather", "reducescatter", "alltoall", "broadcast", "reduce")] \
        == [gather, scatter, exchange, bcast, to_root]


def test_a_companion_of_an_unknown_collective_names_the_valid_ones():
    with pytest.raises(UsageError, match="unknown collective 'gather'; valid choices: "
                                         "allgather, alltoall, broadcast, reduce, "
                                         "reducescatter"):
        companion("gather", "ring")


def test_every_module_of_the_package_is_at_most_350_lines():
    # docs/collectives.md: one concept per module, none past 350 lines; a module that
    # outgrows them is split by concept.
    from pathlib import Path

    import hpctrain.collectives as package

    lengths = {path.name: len(path.read_text().splitlines())
               for path in Path(package.__file__).parent.glob("*.py")}
    assert len(lengths) > 30 and "registry.py" in lengths
    assert {name: n for name, n in lengths.items() if n > 350} == {}


def test_mismatch_check_codes_are_distinct():
    codes = [algorithm_code(name) for name in ALGORITHMS]
    assert len(set(codes)) == len(codes)
    assert len({d.code for d in DTYPES.values()}) == len(DTYPES)


def test_importing_needs_no_mpi():
    import subprocess
    import sys

    code = ("import sys, hpctrain.collectives; "
            "print('mpi4py.MPI' in sys.modules, 'horovod' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.split() == ["False", "False"]


# ----- reductions ---------------------------------------------------------------------------

halves = st.floats(-30000, 30000, width=16)   # sums stay finite
BIG32 = float(np.float32(1e30))     # a bound hypothesis accepts at width 32


@settings(max_examples=200)
@given(a=halves, b=halves)
def test_float16_sums_are_rounded_once_from_float32(a, b):
    dst, src = np.array([a], dtype=np.float16), np.array([b], dtype=np.float16)
    host_reducer(DTYPES["float16"], "sum", 1)(dst.view(np.int16), src.view(np.int16))
    assert dst[0] == np.float16(np.float32(a) + np.float32(b))


@settings(max_examples=200)
@given(a=st.floats(-BIG32, BIG32, width=32), b=st.floats(-BIG32, BIG32, width=32))
def test_bfloat16_sums_are_rounded_once_from_float32(a, b):
    x = torch.tensor([a], dtype=torch.bfloat16)
    y = torch.tensor([b], dtype=torch.bfloat16)
    want = (x.float() + y.float()).bfloat16()
    flat_x, flat_y = x.view(torch.int16).numpy(), y.view(torch.int16).numpy()
    host_reducer(DTYPES["bfloat16"], "sum", 1)(flat_x, flat_y)
    assert torch.equal(x, want)


@settings(max_examples=200)
@given(values=st.lists(st.floats(-BIG32, BIG32, width=32), min_size=4, max_size=4))
def test_the_few_element_sum_rounds_like_numpy(values):
    for count in (1, 2):
        dst = np.array(values[:count], dtype=np.float32)
        src = np.array(values[2:2 + count], dtype=np.float32)
        want = dst + src
        host_reducer(DTYPES["float32"], "sum", count)(dst, src)
        assert np.array_equal(dst, want)


@pytest.mark.parametrize("op, want", [("sum", [3, -1]), ("min", [1, -3]), ("max", [2, 2]),
                                      ("prod", [2, -6])])
def test_host_reducers(op, want):
    dst, src = np.array([1, -3]), np.array([2, 2])
    host_reducer(DTYPES["int64"], op, 2)(dst, src)
    assert dst.tolist() == want


def test_integer_average_is_floor_division():
    flat = np.array([-3, 3, 4], dtype=np.int32)
    averager(DTYPES["int32"], 2, on_device=False)(flat)
    assert flat.tolist() == [-2, 1, 2]
    halves = torch.tensor([3.0, -1.0], dtype=torch.bfloat16)
    averager(DTYPES["bfloat16"], 2, on_device=False)(halves.view(torch.int16).numpy())
    assert halves.tolist() == [1.5, -0.5]
