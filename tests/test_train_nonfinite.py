"""The per-step finiteness verdict on the loss and the gradients."""

import math

import pytest
import torch

from hpctrain.train.nonfinite import GRADIENTS, LOSS, all_finite, verdict

BIG = torch.finfo(torch.float32).max


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_finite_gradients_pass_even_when_their_sum_overflows(dtype):
    big = torch.finfo(dtype).max
    tensors = [torch.full((3,), big, dtype=dtype), torch.full((2, 2), big, dtype=dtype)]
    assert all_finite(tensors) and verdict(1.0, tensors) == 0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_one_bad_element_anywhere_is_found(bad, dtype):
    tensors = [torch.ones(5, dtype=dtype), torch.zeros(4, 4, dtype=dtype)]
    tensors[1][2, 3] = bad
    assert not all_finite(tensors) and verdict(0.5, tensors) == GRADIENTS


def test_infinities_of_both_signs_in_different_tensors_are_found():
    tensors = [torch.tensor([math.inf, 1.0]), torch.tensor([-math.inf])]
    assert not all_finite(tensors)


def test_loss_and_gradients_have_their_own_bits():
    assert verdict(math.nan, [torch.ones(2)]) == LOSS
    assert verdict(math.inf, [torch.tensor([math.nan])]) == LOSS | GRADIENTS
    assert verdict(0.0, []) == 0 and all_finite([])
