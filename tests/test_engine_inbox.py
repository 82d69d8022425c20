"""The engine's request queue returns from a timed wait when preempted (a CPython 3.11 trap).

``queue.SimpleQueue.get(timeout=t)`` first takes its lock without waiting; if the thread is
then preempted for longer than ``t`` before it recomputes the time left, the time left is
negative, and a negative timeout means "wait for ever": the communication thread of one rank
slept until the next request arrived, while every other rank waited for it in a negotiation
(an ``mpi-np4`` test that hung for the whole of pytest-timeout's 600 s). The engine takes its
requests with timeouts of one cycle (1 ms) or less, on machines where ranks outnumber cores,
so it uses a queue whose timed wait checks for that. This test preempts a process that
waits with tiny timeouts on the engine's queue class, pinned to one core beside two busy
loops; with ``queue.SimpleQueue`` in its place it hangs within a few thousand waits.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

WAITS = 20000

CHILD = textwrap.dedent(f"""
    import os, queue, threading, time
    from hpctrain.torch.engine import Inbox

    os.sched_setaffinity(0, {{int(os.environ["PIN_CPU"])}})
    inbox, since = Inbox(), [None]

    def watch():                        # a wait that outlives its timeout by 5 s has hung
        while True:
            time.sleep(0.5)
            started = since[0]
            if started is not None and time.monotonic() - started > 5:
                print("HUNG", flush=True)
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()
    for i in range({WAITS}):
        inbox.put(1)
        inbox.get()                     # empty again, its lock released by the put
        since[0] = time.monotonic()
        try:
            inbox.get(timeout=1e-7 * (1 + i % 20))
        except queue.Empty:
            pass
        since[0] = None
    print("returned", {WAITS}, flush=True)
""")


@pytest.mark.alone
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity")
def test_timed_waits_on_the_engine_inbox_return_when_preempted():
    cpu = min(os.sched_getaffinity(0))
    env = dict(os.environ, PIN_CPU=str(cpu))
    spin = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        run = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    assert run.returncode == 0 and f"returned {WAITS}" in run.stdout, run.stdout + run.stderr
