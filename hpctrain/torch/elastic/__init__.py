"""``hvd.elastic``: training that goes on when ranks are lost, as Horovod's, on MPI.

    import hpctrain.torch as hvd

    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, batch in enumerate(loader, start=state.batch):
                ...                                 # a step
                state.sampler.record_batch(state.batch, batch_size)
                if state.batch % 10 == 0:
                    state.commit()
            state.sampler.set_epoch(state.epoch + 1)
            state.batch = 0
            state.commit()

    train(state)

On an MPI with fault tolerance (Open MPI 5 under ``mpirun --with-ft ulfm``; ``scripts/setup
--ft``) a lost rank costs the steps since the last commit: the survivors shrink the world
and go on in place (:mod:`.in_place`). On any other MPI the job ends and ``python -m hpctrain.launch
--elastic`` starts it again on the hosts that are left, from the last commit
(:mod:`hpctrain.elastic_job`). :mod:`.run` says what happens at each kind of failure.
"""

from .run import run
from .sampler import ElasticSampler
from .state import HostsUpdatedInterrupt, ObjectState, State, TorchState
from ..engine import HorovodInternalError, ProcessFailure

__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState",
           "ProcessFailure", "State", "TorchState", "run"]
