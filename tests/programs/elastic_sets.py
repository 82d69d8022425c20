"""An elastic job with process sets loses a rank: the set that kept its ranks works on the
shrunk world, the set that lost one says so.

Run at np 4 on the fault-tolerant stack. Rank 3 dies (SIGKILL) in its third step, inside
a collective on the set [2, 3]; after the shrink every survivor prints one line: its rank
and size, the sum of an allreduce on the set [0, 1], and what using [2, 3] raised.
"""

import os
import signal

import torch

import hpctrain.torch as hvd

hvd.init()
low, high = hvd.add_process_set([0, 1]), hvd.add_process_set([2, 3])
state = hvd.elastic.ObjectState(step=0)


@hvd.elastic.run
def steps(state):
    while state.step < 5:
        hvd.allreduce(torch.ones(1), name=f"all.{state.step}")
        if hvd.size() == 4 and high.included():
            if hvd.rank() == 3 and state.step == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            hvd.allreduce(torch.ones(1), process_set=high, name=f"high.{state.step}")
        state.step += 1
        state.commit()


steps(state)
pair = (hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=low).item()
        if low.included() else None)
try:
    hvd.allreduce(torch.ones(1), process_set=high)
    lost = "no error"
except ValueError as exc:
    lost = str(exc)
print(f"rank {hvd.rank()} of {hvd.size()}: step {state.step}, [0, 1] sum {pair}, [2, 3]: "
      f"{lost}", flush=True)
hvd.barrier()       # a rank that shuts down ends every rank's operations (as in Horovod)
