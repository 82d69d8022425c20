"""hpctrain.torch without a started world: what is refused, and how."""

import pytest
import torch

import hpctrain.torch as hvd
from hpctrain.torch.buckets import FlatBuffer, assign_buckets
from hpctrain.torch.compression import Compression


@pytest.mark.parametrize("call", [
    lambda: hvd.rank(), lambda: hvd.size(), lambda: hvd.allreduce(torch.ones(2)),
    lambda: hvd.broadcast_parameters({}, 0), lambda: hvd.barrier(),
    lambda: hvd.DistributedOptimizer(torch.optim.SGD([torch.zeros(1, requires_grad=True)],
                                                     lr=1)),
])
def test_everything_before_init_says_to_call_init(call):
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match=r"not been initialized; use hvd.init\(\)"):
        call()


def test_an_unknown_algorithm_in_the_environment_names_the_valid_ones(monkeypatch):
    monkeypatch.setenv("HPCTRAIN_ALLREDUCE", "rign")
    with pytest.raises(ValueError, match=r"HPCTRAIN_ALLREDUCE='rign'.*choose one of: .*ring"):
        hvd.init()
    assert not hvd.is_initialized()


def test_flat_buffer_slots_are_views_shaped_like_the_tensors():
    tensors = [torch.arange(6.).view(2, 3), torch.ones(4), torch.zeros(1, 1)]
    packed = FlatBuffer(tensors)
    packed.pack(tensors)
    assert packed.flat.tolist() == list(range(6)) + [1.0] * 4 + [0.0]
    packed.slot(0).add_(1)
    out = [torch.empty_like(t) for t in tensors]
    packed.unpack(out)
    assert torch.equal(out[0], tensors[0] + 1) and packed.slot(0).data_ptr() == \
        packed.flat.data_ptr()


def test_buckets_go_in_reverse_order_and_split_on_dtype():
    a, b, c = (torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True),
               torch.zeros(3, dtype=torch.float64, requires_grad=True))
    buckets = assign_buckets([("a", a), ("b", b), ("c", c)], 10**6)
    assert [[n for n, _ in group] for group in buckets] == [["c"], ["b", "a"]]


@pytest.mark.parametrize("compression, wire", [(Compression.fp16, torch.float16),
                                               (Compression.bf16, torch.bfloat16)])
def test_compression_casts_floats_only_and_back(compression, wire):
    sent, ctx = compression.compress(torch.ones(3))
    assert sent.dtype == wire and compression.decompress(sent, ctx).dtype == torch.float32
    ints, ctx = compression.compress(torch.ones(3, dtype=torch.int64))
    assert ints.dtype == torch.int64 and compression.decompress(ints, ctx) is ints


def test_every_public_function_goes_to_the_backend_and_before_init_to_our_own():
    from hpctrain.torch import backends

    assert hvd.backend() is backends.NATIVE
    for name in backends.DISPATCHED:
        assert callable(getattr(backends.NATIVE, name)), name
        assert getattr(hvd, name).__wrapped__ is getattr(backends.NATIVE, name), name
        assert name in hvd.__all__


#: The public names of ``horovod.torch`` 0.28.1 (its modules left out): what a Horovod script
#: may call. ``check_extension`` is the one left out here: Horovod's build check for its own
#: compiled extension, which hpctrain.torch does not have.
HOROVOD_TORCH_NAMES = """
Adasum Average Compression DistributedOptimizer HorovodInternalError Max Min ProcessSet Product
Sum SyncBatchNorm add_process_set allgather allgather_async allgather_object allreduce
allreduce_ allreduce_async allreduce_async_ alltoall alltoall_async barrier broadcast
broadcast_ broadcast_async broadcast_async_ broadcast_object broadcast_optimizer_state
broadcast_parameters ccl_built check_extension cross_rank cross_size cuda_built ddl_built
global_process_set gloo_built gloo_enabled grouped_allgather grouped_allgather_async
grouped_allreduce grouped_allreduce_ grouped_allreduce_async grouped_allreduce_async_
grouped_reducescatter grouped_reducescatter_async init is_initialized join local_rank
local_size mpi_built mpi_enabled mpi_threads_supported nccl_built poll rank reducescatter
reducescatter_async remove_process_set rocm_built shutdown size sparse_allreduce_async
start_timeline stop_timeline synchronize
""".split()


def test_all_names_every_public_name_of_horovod_torch():
    assert len(hvd.__all__) == len(set(hvd.__all__)), "a name twice in __all__"
    missing = set(HOROVOD_TORCH_NAMES) - set(hvd.__all__) - {"check_extension"}
    assert not missing, f"horovod.torch has these, hpctrain.torch's __all__ does not: {missing}"
    for name in hvd.__all__:
        assert hasattr(hvd, name), name


def test_horovods_list_here_is_the_installed_horovods():
    import types

    horovod = pytest.importorskip("horovod.torch", reason="Horovod is not built here "
                                  "(scripts/setup --no-horovod)")
    public = {name for name in dir(horovod) if not name.startswith("_")
              and not isinstance(getattr(horovod, name), types.ModuleType)}
    assert public == set(HOROVOD_TORCH_NAMES)


def test_every_public_function_is_defined_by_name_where_a_reader_looks():
    # grep and an editor find `allreduce = ...` in hpctrain/torch/__init__.py; names made
    # in a loop (globals()[name] = ...) they do not.
    import ast
    from pathlib import Path

    tree = ast.parse(Path(hvd.__file__).read_text())
    named = {target.id for node in tree.body if isinstance(node, ast.Assign)
             for target in node.targets if isinstance(target, ast.Name)}
    named |= {alias.asname or alias.name for node in tree.body
              if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    named |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    lazy = {"SyncBatchNorm"}   # loaded on first use, by the module's __getattr__
    assert set(hvd.__all__) - lazy <= named, set(hvd.__all__) - lazy - named
    assert "globals" not in Path(hvd.__file__).read_text()


def test_op_families_import_only_the_common_layer():
    import ast
    from pathlib import Path

    from hpctrain.torch import ops

    families = ["allreduce", "allgather", "broadcast", "reducescatter", "alltoall", "control"]
    for family in families:
        source = Path(ops.__file__).with_name(f"{family}.py").read_text()
        siblings = {(node.module or "").split(".")[0] for node in ast.walk(ast.parse(source))
                    if isinstance(node, ast.ImportFrom) and node.level == 1}
        assert siblings <= {"common"}, (family, siblings)


def test_interfaces_without_psutil_say_what_to_install(monkeypatch):
    import sys

    from hpctrain.errors import UsageError
    from hpctrain.torch.ddp import interface_addresses

    assert "127.0.0.1" in interface_addresses().values()
    monkeypatch.setitem(sys.modules, "psutil", None)
    with pytest.raises(UsageError, match="pip install psutil"):
        interface_addresses()
