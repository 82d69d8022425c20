"""The engine's verdicts on operations that not every member asked for, on one process: an
operation's own timeout (``StallInspector.expired``) and the memory of unnamed operations
that failed (``Failed``), which makes a member that asks late fail with the others.

Under mpirun, tests/mpi/test_torch_distributed.py and tests/test_torch_distributed_launch.py
check the same end to end.
"""

from types import SimpleNamespace

from hpctrain.torch.engine import Failed, StallInspector
from hpctrain.torch.ops.common import signature
from hpctrain.torch.settings import Settings


def entry(first, asked, timeout):
    """A table entry as the engine's (what ``expired`` reads of one)."""
    return SimpleNamespace(first=first, timeout=timeout,
                           signatures={rank: signature("barrier") for rank in asked},
                           describes={rank: "barrier(name='noname.3': )" for rank in asked})


def missing_of(members):
    return lambda key, e: [r for r in members if r not in e.signatures]


def test_an_operation_expires_once_its_own_timeout_has_passed_on_rank_0s_clock():
    inspector = StallInspector(1, Settings())
    table = {(0, "noname.3"): entry(10.0, [0], 1.5), (0, "noname.4"): entry(10.0, [0], None)}
    missing = missing_of([0, 1, 2])
    inspector.note([True, False, False], 11.4)
    assert inspector.expired(table, missing) == []
    inspector.note([True, False, False], 11.5)
    [(key, why)] = inspector.expired(table, missing)
    assert key == (0, "noname.3")           # no timeout: never expires
    assert why.startswith("barrier(name='noname.3': ): Timed out waiting 1500ms for rank(s) "
                          "1, 2, which have not called it (rank(s) 0 have)"), why
    assert " timeout " in why               # what gloo's tests look for, beside " Timed out "


def test_a_failed_operation_fails_each_late_member_once_then_is_forgotten():
    failed = Failed()
    failed.remember((0, "noname.3"), [1, 2], "timed out")
    assert failed.late((0, "noname.3"), 0) is None      # it asked in time: not late
    assert failed.late((0, "noname.4"), 1) is None      # another operation
    assert failed.late((0, "noname.3"), 2) == "timed out"
    assert failed.late((0, "noname.3"), 2) is None      # counted once
    assert failed.late((0, "noname.3"), 1) == "timed out"
    assert failed.late((0, "noname.3"), 1) is None      # every member has asked: forgotten


def test_nothing_is_remembered_where_every_member_had_asked_and_the_memory_is_bounded():
    failed = Failed()
    failed.remember((0, "noname.1"), [], "mismatch")
    assert failed.late((0, "noname.1"), 0) is None
    for n in range(Failed.CAPACITY + 1):
        failed.remember((0, f"noname.{n}"), [1], "timed out")
    assert failed.late((0, "noname.0"), 1) is None      # the oldest went first
    assert failed.late((0, f"noname.{Failed.CAPACITY}"), 1) == "timed out"
