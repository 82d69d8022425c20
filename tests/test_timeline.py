"""The Chrome trace writer (hpctrain/torch/timeline.py), serial: no MPI.

Every written file is parsed as JSON and read back as Chrome would: per (pid, tid), each
``E`` must close the innermost open ``B`` of the same name, and nothing may stay open.
"""

import json
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter

import pytest

from hpctrain.errors import UsageError
from hpctrain.torch import timeline
from hpctrain.torch.timeline import NULL, Timeline, TimelineControl, agree_epoch

PHASES = ("NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER")


def read(path):
    with open(path) as f:
        return json.load(f)


def spans(events):
    """``[(pid, tid, name, begin_ts, end_ts, depth)]`` from matched B/E pairs; asserts that
    they nest and that none is left open."""
    stacks, found = {}, []
    for e in events:
        if e["ph"] not in "BE":
            continue
        stack = stacks.setdefault((e["pid"], e["tid"]), [])
        if e["ph"] == "B":
            stack.append(e)
            continue
        assert stack, f"end without begin: {e}"
        begun = stack.pop()
        assert begun["name"] == e["name"], f"{e} closes {begun}"
        assert begun["ts"] <= e["ts"], f"{e} ends before {begun}"
        found.append((e["pid"], e["tid"], e["name"], begun["ts"], e["ts"], len(stack)))
    assert not any(stacks.values()), f"left open: {stacks}"
    return found


def names(events):
    """Operation name by pid, from the process_name metadata."""
    return {e["pid"]: e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "process_name"}


def one_allreduce(tl, name):
    tl.begin(name, "NEGOTIATE_ALLREDUCE")
    tl.end(name, "NEGOTIATE_ALLREDUCE")
    tl.begin(name, "ALLREDUCE")
    tl.begin(name, "MEMCPY_IN_FUSION_BUFFER")
    tl.end(name, "MEMCPY_IN_FUSION_BUFFER")
    tl.end(name, "ALLREDUCE", args={"dtype": "float32", "shape": [4, 3]})


def test_operations_get_a_process_each_and_their_phases_nest(tmp_path):
    path = tmp_path / "trace.json"
    tl = Timeline(path, rank=0)
    for name in ("grad.fc1", "grad.fc2", "grad.fc1"):
        one_allreduce(tl, name)
    tl.close()
    events = read(path)
    by_pid = names(events)
    assert sorted(by_pid.items()) == [(0, "timeline"), (1, "grad.fc1"), (2, "grad.fc2")]
    found = spans(events)
    assert Counter((by_pid[p], n, depth) for p, _, n, _, _, depth in found) == Counter({
        ("grad.fc1", "NEGOTIATE_ALLREDUCE", 0): 2, ("grad.fc1", "ALLREDUCE", 0): 2,
        ("grad.fc1", "MEMCPY_IN_FUSION_BUFFER", 1): 2,
        ("grad.fc2", "NEGOTIATE_ALLREDUCE", 0): 1, ("grad.fc2", "ALLREDUCE", 0): 1,
        ("grad.fc2", "MEMCPY_IN_FUSION_BUFFER", 1): 1})
    ends = [e for e in events if e["ph"] == "E" and e["name"] == "ALLREDUCE"]
    assert all(e["args"] == {"dtype": "float32", "shape": [4, 3]} for e in ends)


def test_timestamps_count_from_the_common_epoch(tmp_path):
    epoch = time.perf_counter() - 2.0
    tl = Timeline(tmp_path / "t.json", rank=0, epoch=epoch)
    tl.begin("x", "ALLREDUCE")
    tl.end("x", "ALLREDUCE", ts=epoch + 3.5)
    tl.close()
    (_, _, _, begun, ended, _), = spans(read(tmp_path / "t.json"))
    assert 2e6 <= begun < 3e6 and ended == 3.5e6
    # The epoch's wall-clock time, for lining up with other traces: to a tenth of a second.
    start = read(tmp_path / "t.json")[0]["args"]["start_time_since_epoch_in_micros"]
    assert abs(start - (time.time() - (time.perf_counter() - epoch)) * 1e6) < 1e5


def test_only_rank_0_writes_unless_the_path_names_the_rank(tmp_path):
    quiet = Timeline(tmp_path / "shared.json", rank=1)
    one_allreduce(quiet, "x")
    quiet.close()
    assert not quiet.enabled and not (tmp_path / "shared.json").exists()
    assert not quiet._pending and not quiet._pids     # disabled: nothing kept either
    epoch = time.perf_counter()
    per_rank = [Timeline(tmp_path / "rank{rank}.json", rank=r, epoch=epoch) for r in (0, 1)]
    for tl in per_rank:
        one_allreduce(tl, "x")
        tl.close()
    first, second = (read(tmp_path / f"rank{r}.json") for r in (0, 1))
    assert {e["tid"] for e in second} == {1} and {e["tid"] for e in first} == {0}
    # The same epoch: rank 1 recorded after rank 0, and its times say so.
    assert spans(second)[0][3] >= spans(first)[-1][4]


def test_end_closes_the_phases_opened_inside_it(tmp_path):
    tl = Timeline(tmp_path / "t.json")
    tl.begin("x", "ALLREDUCE")
    tl.begin("x", "MEMCPY_IN_FUSION_BUFFER")
    tl.end("x", "ALLREDUCE")
    tl.close()
    assert sorted((n, d) for _, _, n, _, _, d in spans(read(tmp_path / "t.json"))) == [
        ("ALLREDUCE", 0), ("MEMCPY_IN_FUSION_BUFFER", 1)]


def test_ending_what_is_not_open_says_what_is(tmp_path):
    tl = Timeline(tmp_path / "t.json")
    with pytest.raises(ValueError, match="'ALLREDUCE' of 'x', which is not open "
                                         r"\(open phases: none\)"):
        tl.end("x", "ALLREDUCE")
    tl.begin("x", "NEGOTIATE_ALLREDUCE")
    with pytest.raises(ValueError, match="open phases: 'NEGOTIATE_ALLREDUCE'"):
        tl.end("x", "ALLREDUCE")
    tl.close()
    spans(read(tmp_path / "t.json"))


def test_close_ends_what_is_open_and_twice_is_harmless(tmp_path):
    tl = Timeline(tmp_path / "t.json")
    tl.begin("x", "NEGOTIATE_ALLREDUCE")
    tl.close()
    tl.close()
    tl.begin("x", "ALLREDUCE")       # after close: nothing, no error
    tl.end("x", "ALLREDUCE")
    assert [n for _, _, n, _, _, _ in spans(read(tmp_path / "t.json"))] == [
        "NEGOTIATE_ALLREDUCE"]


def test_span_ends_even_when_the_block_raises(tmp_path):
    tl = Timeline(tmp_path / "t.json")
    with pytest.raises(RuntimeError):
        with tl.span("x", "ALLREDUCE"):
            raise RuntimeError("boom")
    tl.close()
    assert len(spans(read(tmp_path / "t.json"))) == 1


def test_names_are_escaped(tmp_path):
    name = 'layer "q"\\k\nv \u00e9'
    tl = Timeline(tmp_path / "t.json")
    one_allreduce(tl, name)
    tl.close()
    assert name in names(read(tmp_path / "t.json")).values()


def test_cycles_are_marked_only_when_asked(tmp_path):
    for marked in (False, True):
        tl = Timeline(tmp_path / f"{marked}.json", mark_cycles=marked)
        tl.mark_cycle()
        tl.instant("checkpoint", args={"step": 3})
        tl.close()
        instants = [e["name"] for e in read(tmp_path / f"{marked}.json") if e["ph"] == "i"]
        assert instants == (["CYCLE_START"] if marked else []) + ["checkpoint"]


def test_threads_may_record_at_once(tmp_path):
    tl = Timeline(tmp_path / "t.json")
    count = 300

    def work(k):
        for i in range(count):
            one_allreduce(tl, f"thread{k}.tensor{i % 7}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tl.close()
    events = read(tmp_path / "t.json")
    assert len(spans(events)) == 4 * count * 3
    assert len(names(events)) == 1 + 4 * 7


def test_the_file_is_valid_json_after_each_flush(tmp_path, monkeypatch):
    monkeypatch.setattr(timeline, "FLUSH_EVENTS", 5)
    tl = Timeline(tmp_path / "t.json")
    assert names(read(tmp_path / "t.json")) == {0: "timeline"}   # from the start
    for i in range(10):
        one_allreduce(tl, f"t{i}")
        assert read(tmp_path / "t.json")        # written by the engine thread, mid-run
    tl.close()
    assert len(spans(read(tmp_path / "t.json"))) == 30


@pytest.mark.parametrize("ending, spans_kept", [("pass", 3 * 50), ("os._exit(0)", None)],
                         ids=["exit without close", "killed after a flush"])
def test_a_process_that_ends_without_close_leaves_valid_json(tmp_path, ending, spans_kept):
    path = tmp_path / "t.json"
    code = textwrap.dedent(f"""\
        import os
        from hpctrain.torch import timeline
        tl = timeline.start({str(path)!r})
        for name in [f"t{{i}}" for i in range(50)]:
            tl.begin(name, "NEGOTIATE_ALLREDUCE")
            tl.end(name, "NEGOTIATE_ALLREDUCE")
            tl.begin(name, "ALLREDUCE")
            tl.begin(name, "MEMCPY_IN_FUSION_BUFFER")
            tl.end(name, "ALLREDUCE")
        tl.flush()
        tl.begin("lost", "ALLREDUCE")
        {ending}
        """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    events = read(path)
    if spans_kept is None:   # what was flushed, and nothing of the unflushed begin
        assert len(spans(events)) == 3 * 50 and "lost" not in names(events).values()
    else:                    # closed at exit: the open phase is ended there
        assert len(spans(events)) == spans_kept + 1


def test_an_unwritable_path_is_refused_with_the_path(tmp_path):
    bad = tmp_path / "missing" / "t.json"
    with pytest.raises(UsageError, match=f"cannot write the timeline to {bad}: .*writable"):
        Timeline(bad)


def test_control_start_stop_current(tmp_path):
    control = TimelineControl()
    control.stop()                                   # stop without start: harmless
    assert control.current() is NULL and not NULL.enabled
    NULL.begin("x", "ALLREDUCE")                     # the no-op timeline takes every call
    NULL.end("x", "ALLREDUCE")
    with NULL.span("x", "ALLREDUCE"):
        pass
    first = control.start(tmp_path / "a.json")
    assert control.current() is first and first.enabled
    assert control.start(tmp_path / "a.json", mark_cycles=True) is first and first.mark_cycles
    one_allreduce(first, "x")
    second = control.start(tmp_path / "b.json")      # another file: the first is closed
    assert not first.enabled and control.current() is second
    control.stop()
    control.stop()
    assert control.current() is NULL
    assert len(spans(read(tmp_path / "a.json"))) == 3 and read(tmp_path / "b.json")


def test_module_functions_use_one_control(tmp_path):
    try:
        tl = timeline.start(tmp_path / "t.json", rank=0)
        assert timeline.current() is tl
    finally:
        timeline.stop()
    assert timeline.current() is NULL


def test_the_common_epoch_is_taken_after_a_barrier():
    calls = []

    class Comm:
        def Barrier(self):
            calls.append(time.perf_counter())

    before = time.perf_counter()
    epoch = agree_epoch(Comm())
    assert len(calls) == 1 and before <= calls[0] <= epoch <= time.perf_counter()
