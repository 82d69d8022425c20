"""The paths of the ``hpctrain`` backend that depend on the torch release
(:mod:`hpctrain.torch.distributed.versions`), checked on the installed torch, with the
release they key on set by hand where the path is an older torch's.

Running the backend on the older releases themselves is docs/torch-distributed.md's
"Torch versions"; these tests keep the older paths working where only one torch is
installed.
"""

import pytest
import torch
import torch.distributed as dist
from torch.torch_version import TorchVersion

from hpctrain.torch.distributed import versions


class Op:
    """A stand-in for a ``ReduceOp``: with ``factor`` where given, as torch 2.13's."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def test_premul_factor_where_torch_gives_it():
    assert versions.premul_factor(Op(factor=0.5)) == 0.5
    assert versions.premul_factor(Op(factor=torch.tensor(4.0))) == 4.0


def test_premul_sum_without_a_factor_names_the_torch_that_gives_it():
    with pytest.raises(NotImplementedError, match=r"ReduceOp\.factor came in torch 2\.13"):
        versions.premul_factor(Op())


def test_a_torch_older_than_the_minimum_is_refused_at_import(monkeypatch):
    versions.check_torch()                  # the installed one passes
    monkeypatch.setattr(torch, "__version__", TorchVersion("2.4.1"))
    with pytest.raises(ImportError, match=r"needs torch >= 2\.5, and this is torch 2\.4\.1"):
        versions.check_torch()


def test_collectives_hand_c_plus_plus_callers_a_work_it_can_wait_for_on_older_torch(
        monkeypatch):
    class Python:
        """A Python work, as the group's: only its future matters here."""

        def __init__(self):
            self.future = torch.futures.Future()

        def get_future(self):
            return self.future

    work = Python()
    assert versions.handed_out(work) is work        # this torch waits through Python
    monkeypatch.setattr(torch, "__version__", TorchVersion("2.5.1"))
    # Called from here, not from torch.distributed's Python API: as C++ would call it.
    handed = versions.handed_out(work)
    assert isinstance(handed, dist.Work) and not handed.is_completed()
    work.future.set_result([torch.ones(1)])
    assert handed.wait() and handed.is_completed()


def test_new_group_is_left_to_torch_where_it_asks_the_default_group():
    import torch.distributed.distributed_c10d as c10d

    if torch.__version__ < versions.DELEGATES_NEW_GROUP:
        pytest.skip(f"torch {torch.__version__} needs the delegation: run in the MPI suite")
    helper = c10d._new_process_group_helper
    versions.delegate_new_group(lambda group: True)
    assert c10d._new_process_group_helper is helper
