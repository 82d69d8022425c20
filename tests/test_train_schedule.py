"""The learning-rate schedule: linear scaling, warm-up and cosine decay."""

import pytest

from hpctrain.train.schedule import WarmupSchedule, target_lr


def test_linear_scaling_and_warmup():
    assert target_lr(0.1, 256, 32, "linear") == pytest.approx(0.8)
    assert target_lr(0.1, 256, 32, "none") == 0.1
    schedule = WarmupSchedule(0.1, 0.8, warmup_steps=10)
    assert schedule(0) == 0.1 and schedule(5) == pytest.approx(0.45)
    assert schedule(10) == schedule(1000) == 0.8
    cosine = WarmupSchedule(0.1, 0.8, warmup_steps=10, total_steps=30, decay="cosine")
    assert cosine(10) == pytest.approx(0.8) and cosine(20) == pytest.approx(0.4)
    assert cosine(30) == pytest.approx(0.0, abs=1e-12)
