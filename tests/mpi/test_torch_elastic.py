"""``hvd.elastic`` on every rank, without losing one: state kept, restored and synced from
rank 0, the sampler's share of what is left of an epoch, resets from an operation that
failed on every rank and from new hosts, the commit written for a restarted job, and bad
input failing on every rank.

Run under mpirun at np = 1..4: ``mpirun -np N python -m pytest --with-mpi
tests/mpi/test_torch_elastic.py``. Losing ranks needs the fault-tolerant stack:
tests/test_elastic_in_place.py.
"""

import threading

import pytest
import torch
from torch import nn

import hpctrain.torch as hvd
from hpctrain import elastic_job

from conftest import all_ranks, raised

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module", autouse=True)
def world(comm):
    hvd.init(allreduce="ring")
    yield
    hvd.shutdown()


def model_of(value):
    model = nn.Linear(2, 1)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    return model


def test_sync_gives_every_rank_rank_0s_state_and_restore_undoes_since_commit(comm):
    model = model_of(comm.rank + 1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, optimizer, epoch=10 + comm.rank, batch=comm.rank)
    state.sync()
    synced = all(torch.equal(p, torch.ones_like(p)) for p in model.parameters())
    ok = synced and (state.epoch, state.batch) == (10, 0)
    with torch.no_grad():
        model.weight.fill_(7.0)
    state.epoch = 99
    state.restore()
    ok = ok and torch.equal(model.weight, torch.ones_like(model.weight)) and state.epoch == 10
    with torch.no_grad():
        model.weight.fill_(3.0)
    state.epoch = 11
    state.commit()
    with torch.no_grad():
        model.weight.fill_(5.0)
    state.restore()
    ok = ok and torch.equal(model.weight, torch.full_like(model.weight, 3.0))
    all_ranks(comm, ok and state.epoch == 11, [state.epoch, model.weight.tolist()])


def test_the_sampler_splits_the_rest_of_the_epoch_without_repeating_a_sample(comm):
    data = list(range(37))
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=3)
    sampler.set_epoch(2)
    first = list(sampler)[:2]                     # two batches of one sample per rank
    for batch in range(2):
        sampler.record_batch(batch, 1)
    done = {i for share in hvd.allgather_object(first) for i in share}
    # A reset (a rank lost, say) repartitions what is left over the ranks there are now.
    sampler.load_state_dict(sampler.state_dict())
    rest = hvd.allgather_object(list(sampler))
    later = [i for share in rest for i in share]
    counts = {len(share) for share in rest}
    fresh = set(data) - done
    ok = (sampler.processed_num == 2 * comm.size and set(later) >= fresh
          and len(counts) == 1 and len(later) - len(fresh) < comm.size
          and done.isdisjoint(later[:len(fresh)]) and len(done) == 2 * comm.size)
    all_ranks(comm, ok, [sorted(done), rest])


def test_run_restores_and_goes_on_after_an_operation_fails_on_every_rank(comm):
    state = hvd.elastic.ObjectState(step=0, tries=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def steps(state):
        state.tries += 1
        while state.step < 4:
            if state.step == 2 and state.tries == 1:
                # Different shapes on the ranks: fails on every rank (one rank: a mismatch
                # with itself is impossible, so it fails by hand).
                if comm.size == 1:
                    raise hvd.HorovodInternalError("injected")
                hvd.allreduce(torch.ones(comm.rank + 1), name="mismatch")
            hvd.allreduce(torch.ones(1), name=f"step.{state.step}")
            state.step += 1
            state.commit()
        return state.step

    result = steps(state)
    all_ranks(comm, result == 4 and resets == [comm.size], [result, resets])


def test_new_hosts_at_a_commit_reset_every_rank_together(comm, tmp_path_factory,
                                                         monkeypatch):
    folder = tmp_path_factory.mktemp("elastic") if comm.rank == 0 else None
    folder = comm.bcast(folder)
    monkeypatch.setenv(elastic_job.ENV_DIR, str(folder))
    state = hvd.elastic.ObjectState(step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(state.step)])
    if comm.rank == 0:
        elastic_job.write_hosts(folder, 0, [("localhost", comm.size)])
    comm.Barrier()

    @hvd.elastic.run
    def steps(state):
        while state.step < 3:
            state.step += 1
            if state.step == 2 and comm.rank == 0 and not resets:
                elastic_job.write_hosts(folder, 1, [("localhost", comm.size + 1)])
            state.commit()
    # Under the launcher (a state folder) new hosts end every rank with status 75.
    with pytest.raises(SystemExit) as ended:
        steps(state)
    saved = (folder / elastic_job.STATE_FILE).exists()
    all_ranks(comm,
              ended.value.code == elastic_job.EXIT_HOSTS_UPDATED and saved and state.step == 2,
              [ended.value.code, saved, state.step])
    hvd.init(allreduce="ring")              # the exit path shut the world down


def test_a_restarted_job_begins_from_the_commit_rank_0_wrote(comm, tmp_path_factory,
                                                             monkeypatch):
    folder = comm.bcast(tmp_path_factory.mktemp("resume") if comm.rank == 0 else None)
    monkeypatch.setenv(elastic_job.ENV_DIR, str(folder))
    model = model_of(2.0)
    state = hvd.elastic.TorchState(model, epoch=0)

    @hvd.elastic.run
    def first(state):
        with torch.no_grad():
            model.weight.fill_(4.0)
        state.epoch = 3
        state.commit()

    first(state)
    # A new start: fresh objects, the commit read by rank 0 and synced to every rank.
    model2 = model_of(-1.0)
    again = hvd.elastic.TorchState(model2, epoch=0)

    @hvd.elastic.run
    def second(state):
        return state.epoch, model2.weight.flatten().tolist()

    epoch, weights = second(again)
    all_ranks(comm, epoch == 3 and weights == [4.0, 4.0], [epoch, weights])


def test_a_commit_outside_run_in_an_elastic_job_is_refused_on_every_rank(comm, monkeypatch):
    monkeypatch.setenv(elastic_job.ENV_DIR, "/nonexistent-elastic-folder")
    state = hvd.elastic.ObjectState(step=0)
    error = raised(state.commit)
    all_ranks(comm, isinstance(error, RuntimeError) and "outside hvd.elastic.run" in str(error),
              [error])


def test_a_state_that_cannot_be_broadcast_fails_on_every_rank(comm):
    state = hvd.elastic.ObjectState(lock=threading.Lock() if comm.rank == 0 else None)
    error = raised(state.sync)
    hvd.barrier()       # the world is still usable
    # Rank 0 raises the ValueError; the others learn of it in the operation (and raise
    # HorovodInternalError with rank 0's reason), instead of waiting in the broadcast.
    all_ranks(comm, isinstance(error, (ValueError, hvd.HorovodInternalError))
              and "rank 0's object cannot be broadcast" in str(error)
              and "does not pickle" in str(error), [error])
