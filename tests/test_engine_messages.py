"""The engine's typed messages, on one process: a request's ``Signature`` (what every rank of
an operation must pass alike, compared across ranks after pickling) and the cache's
``Response``. Under mpirun, tests/mpi/test_torch_negotiation.py checks the mismatches they
decide.
"""

import dataclasses
import pickle
from types import SimpleNamespace

import pytest
import torch

from hpctrain.torch.engine import INVALID, Request, ResponseCache, Signature
from hpctrain.torch.ops.common import Sum, signature


def test_a_signature_compares_and_hashes_alike_after_pickling():
    mine = signature("allreduce", [torch.zeros(2, 3), torch.zeros(4, dtype=torch.int64)], Sum,
                     0.5, 2, extra=(7,))
    theirs = pickle.loads(pickle.dumps(mine, protocol=pickle.HIGHEST_PROTOCOL))
    assert theirs == mine and hash(theirs) == hash(mine) and len({mine, theirs}) == 1
    assert pickle.loads(pickle.dumps(INVALID)) == INVALID


@pytest.mark.parametrize("field, other", [
    ("kind", "reducescatter"), ("shapes", ((2, 4), (4,))), ("dtypes", ("float64", "int64")),
    ("devices", ("cuda", "cpu")), ("op", 0), ("prescale", 1.0), ("postscale", 1.0),
    ("extra", (8,)),
])
def test_signatures_that_differ_in_any_field_differ(field, other):
    mine = signature("allreduce", [torch.zeros(2, 3), torch.zeros(4, dtype=torch.int64)], Sum,
                     0.5, 2, extra=(7,))
    assert dataclasses.replace(mine, **{field: other}) != mine


def test_a_signature_cannot_change_and_carries_no_dict():
    agreed = signature("barrier")
    with pytest.raises(dataclasses.FrozenInstanceError):
        agreed.kind = "allreduce"
    assert not hasattr(agreed, "__dict__")
    assert agreed == Signature("barrier", (), (), (), None, 1.0, 1.0, ())


def test_the_builder_names_every_field():
    rows = torch.zeros(5, 3, dtype=torch.float16)
    gathered = signature("allgather", [rows], ragged=True)
    assert (gathered.shapes, gathered.dtypes, gathered.devices) == (((3,),), ("float16",),
                                                                    ("cpu",))
    bucket = signature("allreduce", [torch.zeros(6)], Sum, 1, 0.25, (123, 2),
                       dtypes=["bfloat16"])
    assert bucket == Signature("allreduce", ((6,),), ("bfloat16",), ("cpu",), Sum, 1.0, 0.25,
                               (123, 2))
    assert isinstance(bucket.prescale, float)


def test_the_cache_numbers_a_response_and_announces_its_request_by_it():
    cache = ResponseCache(capacity=4)
    agreed = signature("allreduce", [torch.zeros(6)], Sum)
    request = Request(0, "bucket.0", agreed, "bucket 0", None, repeats=True)
    assert cache.number_of(request) is None
    entry = SimpleNamespace(repeats=True, describes={0: "bucket 0", 1: "bucket 0 of rank 1"})
    cache.remember(request.key, entry, agreed, joined=[])
    response = cache.asked(0)
    assert (response.number, response.key, response.signature) == (0, (0, "bucket.0"), agreed)
    assert response.describes[1] == "bucket 0 of rank 1" and cache.number_of(request) == 0
    other = Request(0, "bucket.0", dataclasses.replace(agreed, shapes=((7,),)), "bucket 0",
                    None, repeats=True)
    assert cache.number_of(other) is None
