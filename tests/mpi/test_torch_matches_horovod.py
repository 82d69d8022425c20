"""hpctrain.torch against Horovod's behaviour, for every allreduce algorithm.

Run under mpirun at np = 1..4: ``mpirun -np N python -m pytest --with-mpi
tests/mpi/test_torch_matches_horovod.py``. Each algorithm's tests run between one ``init``
and one ``shutdown``; ``horovod`` (the real Horovod) runs the same tests last, so the
expectations below are Horovod's own. The optimizer's weights are compared with those
Horovod's ``DistributedOptimizer`` reaches on the same data.

At np = 1 a reduction's values are its input's; what the tests check there is the API around
them: a new tensor or the same one, the dtype, the scaling factors, the argument checks.
"""

import threading

import numpy as np
import pytest
import torch
from torch import nn

import hpctrain.torch as hvd
from hpctrain import collectives

from conftest import TORCH_ALGOS, all_ranks

pytestmark = pytest.mark.mpi

ALGOS = TORCH_ALGOS + [a for a in collectives.available() if a == "horovod"]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.int32, torch.int64]


@pytest.fixture(params=ALGOS, scope="module")
def algo(request):
    hvd.init(allreduce=request.param)
    yield request.param
    hvd.shutdown()


def test_our_communication_thread_runs_only_for_our_algorithms(algo):
    # Under horovod every call goes to Horovod's own thread; an idle engine of ours beside it
    # would poll MPI every cycle for nothing, and makes Horovod's blocked thread spin.
    names = {thread.name for thread in threading.enumerate()}
    assert ("hpctrain-comm" in names) == (algo != "horovod"), names


def ours(algo):
    if algo == "horovod":
        pytest.skip("hpctrain's own behaviour (Horovod differs or has no such check)")


def values(rank, dtype, n=17):
    # Integer-valued, so every order of summation gives the same exact result.
    return (torch.arange(n, dtype=torch.float64) % 7 - 3 + rank).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_sum_average_min_max_give_new_tensors(algo, comm, dtype):
    size, rank = comm.size, comm.rank
    mine = values(rank, dtype)
    stack = torch.stack([values(r, torch.float64) for r in range(size)])
    expect = {hvd.Sum: stack.sum(0), hvd.Min: stack.min(0).values,
              hvd.Max: stack.max(0).values, hvd.Average: stack.sum(0) / size}
    if not dtype.is_floating_point:
        expect[hvd.Average] = torch.trunc(stack.sum(0) / size)   # Horovod truncates
    bad = []
    for op, want in expect.items():
        before = mine.clone()
        got = hvd.allreduce(mine, op=op, name=f"t{op}")
        if not torch.equal(mine, before):
            bad.append(f"op {op} changed its input")
        if got.data_ptr() == mine.data_ptr():   # at np = 1 too, where the values are equal
            bad.append(f"op {op} returned its input, not a new tensor")
        if got.dtype != dtype or not torch.allclose(got.double(), want, atol=1e-3):
            bad.append(f"op {op}: {got.tolist()} != {want.tolist()}")
    all_ranks(comm, not bad, bad)


def test_allreduce_in_place_and_average_flag(algo, comm):
    t = values(comm.rank, torch.float32)
    out = hvd.allreduce_(t, average=False)
    want = sum(values(r, torch.float32) for r in range(comm.size))
    all_ranks(comm, out is t and torch.equal(t, want), [t.tolist()])


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_prescale_and_postscale_factors_multiply_the_result(algo, comm, op):
    # Applied at every size, np = 1 included (where the reduction itself changes nothing).
    t = values(comm.rank, torch.float32)
    got = hvd.allreduce(t, op=getattr(hvd, op), prescale_factor=3.0, postscale_factor=0.5)
    total = sum(values(r, torch.float64) for r in range(comm.size))
    want = 1.5 * total / (comm.size if op == "Average" else 1)
    all_ranks(comm, got.dtype == torch.float32 and torch.allclose(got.double(), want),
              [f"{got.tolist()} != {want.tolist()}"])


def test_op_and_average_together_are_refused(algo, comm):
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(torch.ones(3), average=True, op=hvd.Sum)


def test_async_handles_poll_and_synchronize(algo, comm):
    tensors = [values(comm.rank, torch.float32, n) for n in (1, 5, 1000)]
    handles = [hvd.allreduce_async(t, name=f"async.{i}", op=hvd.Sum)
               for i, t in enumerate(tensors)]
    while not all(hvd.poll(h) for h in handles):   # poll before synchronize, as Horovod
        pass
    results = [hvd.synchronize(h) for h in handles]
    polled = True
    want = [sum(values(r, torch.float32, t.numel()) for r in range(comm.size)) for t in tensors]
    all_ranks(comm, polled and all(torch.equal(a, b) for a, b in zip(results, want)))


def test_in_place_async_and_grouped(algo, comm):
    a, b = values(comm.rank, torch.float32, 3), values(comm.rank, torch.float64, 4)
    hvd.synchronize(hvd.allreduce_async_(a, op=hvd.Sum, name="ip"))
    grouped = hvd.grouped_allreduce([values(comm.rank, torch.float32, 3), b], op=hvd.Sum)
    hvd.grouped_allreduce_([b], op=hvd.Sum)
    want_a = sum(values(r, torch.float32, 3) for r in range(comm.size))
    want_b = sum(values(r, torch.float64, 4) for r in range(comm.size))
    ok = (torch.equal(a, want_a) and torch.equal(grouped[0], want_a)
          and torch.equal(grouped[1], want_b) and torch.equal(b, want_b))
    all_ranks(comm, ok)


def test_allreduce_has_a_gradient(algo, comm):
    if algo == "horovod":
        pytest.skip("Horovod 0.28.1 fails on the expanded gradient of .sum()")
    x = torch.ones(4, requires_grad=True)
    hvd.allreduce(x * (comm.rank + 1), op=hvd.Sum).sum().backward()
    all_ranks(comm, torch.equal(x.grad, torch.full((4,), float(comm.size * (comm.rank + 1)))))


def test_broadcast_from_every_root(algo, comm):
    bad = []
    for root in range(comm.size):
        for dtype in (torch.float32, torch.int64, torch.float16, torch.uint8):
            t = torch.full((2, 3), comm.rank + 1).to(dtype)
            new = hvd.broadcast(t, root, name=f"b{root}{dtype}")
            if not (torch.equal(new, torch.full((2, 3), root + 1).to(dtype))
                    and torch.equal(t, torch.full((2, 3), comm.rank + 1).to(dtype))):
                bad.append(f"broadcast root {root} {dtype}")
            hvd.synchronize(hvd.broadcast_async_(t, root))
            if not torch.equal(t, torch.full((2, 3), root + 1).to(dtype)):
                bad.append(f"broadcast_ root {root} {dtype}")
    all_ranks(comm, not bad, bad)


def model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))


def test_parameters_optimizer_state_and_objects_come_from_root(algo, comm):
    root = comm.size - 1
    net = model(comm.rank)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.ones(2, 5)).sum().backward()
    opt.step()
    hvd.broadcast_parameters(net.state_dict(), root_rank=root)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    weights = [p.detach().numpy().copy() for p in net.parameters()]
    momenta = [opt.state[p]["momentum_buffer"].numpy().copy() for p in net.parameters()]
    everyone = comm.allgather((weights, momenta))
    same = all(np.array_equal(a, b) for other in everyone
               for a, b in zip(other[0] + other[1], everyone[0][0] + everyone[0][1]))
    obj = hvd.broadcast_object({"rank": comm.rank}, root_rank=root)
    gathered = hvd.allgather_object(comm.rank * 10)
    hvd.barrier()
    all_ranks(comm, same and obj == {"rank": root} and gathered == [r * 10 for r in
                                                                     range(comm.size)])


def train_steps(opt_factory, steps=4, **options):
    """A few steps of a model under ``hvd.DistributedOptimizer``; the final weights."""
    net = model(1)
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt_factory(net.parameters()),
                                   named_parameters=net.named_parameters(), **options)
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 * step + hvd.rank())
        x, y = torch.randn(6, 5, generator=gen), torch.randint(0, 3, (6,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()], opt


OPTIMIZERS = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3),
              "adam": lambda p: torch.optim.Adam(p, lr=0.01)}
HOROVOD_WEIGHTS = {}


@pytest.fixture(scope="module")
def horovod_weights(comm):
    """The weights Horovod's DistributedOptimizer reaches, per optimizer (computed once)."""
    if "horovod" not in collectives.available():
        pytest.skip("Horovod is not installed")
    if not HOROVOD_WEIGHTS:
        started = hvd.is_initialized() and hvd.algorithm()
        hvd.shutdown()
        hvd.init(allreduce="horovod")
        for name, factory in OPTIMIZERS.items():
            HOROVOD_WEIGHTS[name] = train_steps(factory)[0]
        hvd.shutdown()
        if started:
            hvd.init(allreduce=started)
    return HOROVOD_WEIGHTS


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_distributed_optimizer_reaches_horovods_weights(algo, comm, horovod_weights, name):
    got, _ = train_steps(OPTIMIZERS[name])
    want = horovod_weights[name]
    all_ranks(comm, all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want)),
              [f"{(a - b).abs().max().item():g}" for a, b in zip(got, want)])


def test_gradients_live_in_their_buckets_and_a_lone_one_where_autograd_put_it(algo, comm):
    ours(algo)
    if comm.size == 1:
        pytest.skip("one rank reduces nothing: its gradients stay where autograd put them")
    net = model(1)
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                   named_parameters=net.named_parameters(),
                                   bucket_mb=200 / 2**20)
    # 200 bytes: [2.bias, 2.weight, 0.bias] share a bucket, 0.weight (140 bytes) is alone.
    shared = [b for b in opt.buckets if len(b.params) > 1]
    alone = [b.params[0] for b in opt.buckets if len(b.params) == 1]
    results = []
    for step in range(2):
        opt.zero_grad()
        gen = torch.Generator().manual_seed(10 * step + comm.rank)
        x = torch.randn(4, 5, generator=gen)
        # This rank's own gradients from autograd.grad, which accumulates nothing and so
        # hands nothing over: after backward, a lone gradient may already be being reduced
        # in place, and a copy of it taken then would be half-averaged.
        local = torch.autograd.grad(net(x).pow(2).sum(), list(net.parameters()))
        net(x).pow(2).sum().backward()
        made = {p: p.grad for p in alone}
        opt.synchronize()
        everyone = comm.allgather(local)
        average = [sum(grads[i] for grads in everyone) / comm.size for i in range(len(local))]
        results.append(all(torch.allclose(p.grad, a, atol=1e-6)
                           for p, a in zip(net.parameters(), average)))
        for bucket in shared:
            flat = bucket.buffer.flat
            for p in bucket.params:
                start = (p.grad.data_ptr() - flat.data_ptr()) // flat.element_size()
                results.append(0 <= start < flat.numel())
        results.extend(p.grad is made[p] for p in alone)   # reduced where it lies
        with opt.skip_synchronize():
            opt.step()
    all_ranks(comm, len(shared) == 1 and len(alone) == 1 and all(results), [str(results)])


def test_backward_passes_per_step_accumulates_locally(algo, comm):
    net = model(1)
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=1.0),
                                   named_parameters=net.named_parameters(),
                                   backward_passes_per_step=2, op=hvd.Sum)
    start = [p.detach().clone() for p in net.parameters()]
    for _ in range(2):
        net(torch.ones(1, 5)).sum().backward()
    opt.step()
    reference = model(1)
    for _ in range(2):
        reference(torch.ones(1, 5)).sum().backward()
    want = [s - comm.size * q.grad for s, q in zip(start, reference.parameters())]
    all_ranks(comm, all(torch.allclose(p, w, atol=1e-5) for p, w in zip(net.parameters(), want)))


def test_zero_grad_between_backward_and_step_is_refused(algo, comm):
    ours(algo)
    net = model(1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                   named_parameters=net.named_parameters())
    net(torch.ones(1, 5)).sum().backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.step()


def test_duplicate_and_missing_names_are_refused(algo, comm):
    net = model(1)
    params = list(net.named_parameters())
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                 named_parameters=[("same", p) for _, p in params])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                 named_parameters=params[:1])


def test_a_name_still_in_flight_is_refused(algo, comm):
    ours(algo)
    if comm.size == 1:
        pytest.skip("with one rank an operation is in flight for microseconds only")
    # Rank 0's "dup" stays in flight until the others ask for it, after the barrier (which
    # is paired by its own name, so it does not wait for "dup").
    if comm.rank == 0:
        handle = hvd.allreduce_async(torch.ones(2), name="dup")
        with pytest.raises(ValueError, match="same name"):
            hvd.allreduce_async(torch.ones(2), name="dup")
    hvd.barrier()
    if comm.rank != 0:
        handle = hvd.allreduce_async(torch.ones(2), name="dup")
    all_ranks(comm, torch.equal(hvd.synchronize(handle), torch.ones(2)))


@pytest.mark.parametrize("what", ["shape", "dtype", "root"])
def test_ranks_that_disagree_all_raise_instead_of_hanging(algo, comm, what):
    ours(algo)
    if comm.size == 1:
        pytest.skip("one rank always agrees with itself")
    last = comm.rank == comm.size - 1
    tensor = torch.ones(3 + (what == "shape" and last),
                        dtype=torch.float64 if what == "dtype" and last else torch.float32)
    with pytest.raises(RuntimeError, match="different arguments"):
        if what == "root":
            hvd.broadcast(tensor, root_rank=int(last))
        else:
            hvd.allreduce(tensor)
    hvd.barrier()   # the world is still usable


def test_a_bad_argument_on_one_rank_fails_every_rank(algo, comm):
    ours(algo)
    bad = comm.rank == 0
    with pytest.raises((TypeError, RuntimeError)) as raised:
        hvd.allreduce([1.0, 2.0] if bad else torch.ones(2))
    expected = TypeError if bad else RuntimeError
    all_ranks(comm, issubclass(raised.type, expected), [raised.value])
    hvd.barrier()


def test_what_is_not_supported_says_so(algo, comm):
    ours(algo)
    with pytest.raises(TypeError, match="process_set must be an hvd.ProcessSet"):
        hvd.allreduce(torch.ones(2), process_set=object())
    hvd.barrier()


def test_world_matches_mpi_and_build_flags(algo, comm):
    ok = (hvd.rank(), hvd.size()) == (comm.rank, comm.size) and hvd.mpi_built()
    ok = ok and 0 <= hvd.local_rank() < hvd.local_size() <= comm.size
    ok = ok and 0 <= hvd.cross_rank() < hvd.cross_size()
    all_ranks(comm, ok and isinstance(hvd.nccl_built(), (bool, int)))


def test_a_tensor_on_an_unsupported_device_is_refused_everywhere(algo, comm):
    ours(algo)
    with pytest.raises(ValueError, match="tensors on 'meta' are not supported"):
        hvd.allreduce(torch.empty(2, device="meta"))
    hvd.barrier()
