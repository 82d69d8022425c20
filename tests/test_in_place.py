"""The one recovery in place (hpctrain.torch.elastic.in_place), without MPI: communicators
that count what is asked of them stand in for ULFM's. The end-to-end runs, `hvd.elastic.run`
and `hpctrain train --elastic` under a fault-tolerant MPI, are tests/test_elastic_in_place.py."""

import pytest

from hpctrain import elastic_job, log
from hpctrain.mpi import ulfm
from hpctrain.torch.elastic import in_place
from hpctrain.torch.engine import HorovodInternalError, ProcessFailure


@pytest.fixture(autouse=True)
def _log_rank(monkeypatch):
    # survivors() sets the rank that logs (the survivors' rank 0): put it back after.
    monkeypatch.setattr(log._World, "rank", log._World.rank)


class Comm:
    """A communicator of ``size`` ranks, this one rank 0, that shrinks by one."""

    def __init__(self, size, revoked=False):
        self.size, self.revoked, self.shrunk = size, revoked, False

    def Get_size(self):         # noqa: N802 - mpi4py's name
        return self.size

    def Get_rank(self):         # noqa: N802
        return 0

    def Revoke(self):           # noqa: N802
        if self.revoked:
            raise RuntimeError("revoked already")
        self.revoked = True

    def Shrink(self):           # noqa: N802
        self.shrunk = True
        return Comm(self.size - 1)


def test_revoke_ignores_a_communicator_revoked_already_and_shrink_revokes_first():
    comm = Comm(3, revoked=True)
    ulfm.revoke(comm)                                   # raises nothing
    fresh = Comm(3)
    shrunk = ulfm.shrink(fresh)
    assert fresh.revoked and fresh.shrunk and shrunk.Get_size() == 2


def test_recover_tries_again_on_the_survivors_until_no_rank_is_lost(monkeypatch, tmp_path):
    monkeypatch.setenv(elastic_job.ENV_DIR, str(tmp_path))
    sizes = []

    def attempt(comm):
        sizes.append(comm.Get_size())
        if len(sizes) < 3:
            raise ProcessFailure("another rank died")
        return "trained"

    assert in_place.recover(Comm(5), attempt) == "trained"
    assert sizes == [4, 3, 2]
    shrinks = [(e["before"], e["after"]) for e in elastic_job.read_events(tmp_path)]
    assert shrinks == [(5, 4), (4, 3), (3, 2)]


def test_recover_raises_what_is_no_lost_rank():
    def attempt(comm):
        raise HorovodInternalError("a mismatch")

    assert not in_place.lost_rank(HorovodInternalError("a mismatch"))
    with pytest.raises(HorovodInternalError, match="a mismatch"):
        in_place.recover(Comm(3), attempt)


def test_fewer_survivors_than_the_minimum_end_the_job(monkeypatch):
    monkeypatch.setenv(elastic_job.ENV_MIN_NP, "3")
    with pytest.raises(SystemExit) as ended:
        in_place.recover(Comm(3), lambda comm: pytest.fail("no attempt below the minimum"))
    assert ended.value.code == elastic_job.EXIT_TOO_FEW
