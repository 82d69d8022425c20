"""A stand-in for a training script under ``python -m hpctrain.launch --elastic``: the ranks'
side of the contract in hpctrain/elastic_job.py, without torch, so that a start takes a second.

    elastic_counter.py --steps N [--step-seconds S] [--hosts-file F]
                       [--fault START,RANK,STEP[,HOSTS]]... [--grow START,STEP,HOSTS]

Each step is an allreduce in which every rank counts one sample. Rank 0 then commits
``{"step", "samples"}`` to state.pt (JSON, where the real ranks use torch.save) and reads
hosts.json: the commit is collective, as ``state.commit()`` is, and every rank learns there
whether the launcher published hosts newer than this start's (exit 75). A start resumes at
the committed step; fewer ranks than HPCTRAIN_ELASTIC_MIN_NP exit 76.

- ``--fault START,RANK,STEP[,HOSTS]``: in start START (``HPCTRAIN_ELASTIC_RESTART``), rank
  RANK writes HOSTS (``;`` between lines) to the discovery script's file F, then SIGKILLs
  itself before step STEP: its node is gone;
- ``--grow START,STEP,HOSTS``: in start START, rank 0 writes HOSTS to F before step STEP,
  and the commit of that step waits (at most 60 s) until the launcher publishes new hosts.

Rank 0 prints ``rank 0 of N: start R at step K`` first and ``finished: step N, samples S``
last, and logs ``rank_start`` (with every rank's pid, and when its process began), ``up``
(the start is up: every rank has the state) and ``fault`` events to events.jsonl.
"""

import argparse
import json
import os
import signal
import sys
import time

began = time.time()

from mpi4py import MPI  # noqa: E402 - the time before it is part of a start's cost

from hpctrain import elastic_job  # noqa: E402
from hpctrain.data.atomic import atomic_path  # noqa: E402

GROW_WAIT = 60  # s: a launcher that publishes nothing by then fails the test, no hang


def options():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-seconds", type=float, default=0.02)
    parser.add_argument("--hosts-file")
    parser.add_argument("--fault", action="append", default=[])
    parser.add_argument("--grow")
    return parser.parse_args()


def write_hosts_file(path, hosts):
    with atomic_path(path) as tmp:
        tmp.write_text(hosts.replace(";", "\n") + "\n")


def resume(folder):
    path = folder / elastic_job.STATE_FILE
    return json.loads(path.read_text()) if path.exists() else {"step": 0, "samples": 0}


def commit(comm, folder, state, version, wait):
    """Rank 0 writes the state and reads hosts.json (waiting up to GROW_WAIT s for a newer
    version when ``wait``); every rank gets the version. Collective."""
    newest = None
    if comm.rank == 0:
        with atomic_path(folder / elastic_job.STATE_FILE) as tmp:
            tmp.write_text(json.dumps(state))
        deadline = time.monotonic() + (GROW_WAIT if wait else 0)
        newest = elastic_job.read_hosts(folder)[0]
        while newest <= version and time.monotonic() < deadline:
            time.sleep(0.05)
            newest = elastic_job.read_hosts(folder)[0]
    return comm.bcast(newest, root=0)


def main():
    args = options()
    comm = MPI.COMM_WORLD
    folder = elastic_job.state_dir()
    start = int(os.environ[elastic_job.ENV_RESTART])
    version = int(os.environ[elastic_job.ENV_HOSTS_VERSION])
    if comm.size < elastic_job.int_setting(elastic_job.ENV_MIN_NP, 1):
        sys.exit(elastic_job.EXIT_TOO_FEW)
    state = resume(folder) if comm.rank == 0 else None
    state = comm.bcast(state, root=0)
    pids = comm.gather(os.getpid(), root=0)
    if comm.rank == 0:
        print(f"rank 0 of {comm.size}: start {start} at step {state['step']}", flush=True)
        elastic_job.log_event(folder, "rank_start", start=start, np=comm.size, step=state["step"],
                          pids=pids, process_began=began)
    elastic_job.log_up(comm.rank, np=comm.size)     # every rank has started and has the state
    faults = [f.split(",", 3) for f in args.fault]
    grow = args.grow.split(",", 2) if args.grow else None
    for step in range(state["step"], args.steps):
        for when, rank, at, *hosts in faults:
            if (int(when), int(rank), int(at)) == (start, comm.rank, step):
                if hosts:
                    write_hosts_file(args.hosts_file, hosts[0])
                elastic_job.log_event(folder, "fault", start=start, rank=comm.rank, step=step)
                print(f"rank {comm.rank} of {comm.size}: SIGKILL at step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        growing = grow is not None and (int(grow[0]), int(grow[1])) == (start, step)
        if growing and comm.rank == 0:
            write_hosts_file(args.hosts_file, grow[2])
        state["samples"] += comm.allreduce(1)
        state["step"] = step + 1
        if commit(comm, folder, state, version, growing) > version:
            if comm.rank == 0:
                print(f"rank 0: new hosts at step {step + 1}: exit 75", flush=True)
            sys.exit(elastic_job.EXIT_HOSTS_UPDATED)
        time.sleep(args.step_seconds)
    if comm.rank == 0:
        print(f"finished: step {state['step']}, samples {state['samples']}", flush=True)


if __name__ == "__main__":
    main()
