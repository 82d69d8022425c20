"""A Horovod elastic script cut down to its start: ``hvd.init``, an ``ObjectState``, and
``hvd.elastic.run`` over ``--steps`` steps of one allreduce and a commit each, so that a
job's time is its start-up (Python, torch, MPI). Every rank prints when ``init`` returned
to it, in which start of the elastic job; rank 0 prints ``done: N steps on S ranks, sum T``
last (T: the ranks counted over the steps, each step counted once).

    python -m hpctrain.launch --elastic -np 4 python tests/programs/elastic_start.py
"""

import argparse
import time

import torch

import hpctrain.torch as hvd
from hpctrain import elastic_job


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    hvd.init()
    print(f"rank {hvd.rank()} of {hvd.size()}: init returned in start {elastic_job.this_start()} "
          f"(t={time.time():.3f})", flush=True)
    state = hvd.elastic.ObjectState(step=0, total=0)

    @hvd.elastic.run
    def train(state):
        while state.step < args.steps:
            state.total += int(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="count").item())
            state.step += 1
            state.commit()

    train(state)
    if hvd.rank() == 0:
        print(f"done: {state.step} steps on {hvd.size()} ranks, sum {state.total}", flush=True)


if __name__ == "__main__":
    main()
