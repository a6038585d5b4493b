"""LR schedules vs hand-computed values."""

import logging
import math

import ml_collections
import numpy as np
import pytest

from composer_jax.optim import schedules

PEAK, FLOOR = 2.0, 0.2


def _cfg(**kw):
  base = dict(
    schedule="cosine", warmup_steps=10, total_steps=110, min_lr_ratio=0.1, wsd_decay_fraction=0.2
  )
  return ml_collections.ConfigDict({**base, **kw})


def _cosine(t):
  return FLOOR + (PEAK - FLOOR) * 0.5 * (1 + math.cos(math.pi * (t - 10) / 100))


@pytest.mark.parametrize(
  "kind,expected",
  [
    ("cosine", {0: 0.0, 5: 1.0, 10: PEAK, 35: _cosine(35), 60: 1.1, 110: FLOOR, 500: FLOOR}),
    # 22 decay steps from step 88: linear from PEAK to FLOOR.
    ("wsd", {0: 0.0, 5: 1.0, 10: PEAK, 50: PEAK, 88: PEAK, 99: 1.1, 110: FLOOR, 500: FLOOR}),
  ],
)
def test_hand_values(kind, expected):
  sched = schedules.make_schedule(_cfg(schedule=kind), PEAK)
  steps = sorted(expected)
  got = [float(sched(np.int32(t))) for t in steps]
  np.testing.assert_allclose(got, [expected[t] for t in steps], rtol=1e-6, atol=1e-7)


def test_no_warmup_starts_at_peak():
  sched = schedules.make_schedule(_cfg(warmup_steps=0), PEAK)
  assert float(sched(0)) == pytest.approx(PEAK)
  assert float(sched(50)) == pytest.approx(
    FLOOR + (PEAK - FLOOR) * 0.5 * (1 + math.cos(math.pi * 50 / 110)), rel=1e-6
  )


def test_wsd_without_warmup_or_decay_is_constant(caplog):
  caplog.set_level(logging.INFO)
  sched = schedules.make_schedule(
    _cfg(schedule="wsd", warmup_steps=0, wsd_decay_fraction=0.0), PEAK
  )
  np.testing.assert_array_equal([float(sched(t)) for t in (0, 1, 109, 110, 500)], [PEAK] * 5)
  assert "non-positive" not in caplog.text  # no zero-length optax pieces


@pytest.mark.parametrize(
  "overrides,match",
  [
    (dict(schedule="linear"), "Unknown LR schedule 'linear'"),
    (dict(warmup_steps=110), "warmup_steps < total_steps"),
    (dict(min_lr_ratio=1.5), "min_lr_ratio must be in"),
    (dict(schedule="wsd", wsd_decay_fraction=0.95), "wsd_decay_fraction=0.95"),
  ],
)
def test_bad_config_raises(overrides, match):
  with pytest.raises(ValueError, match=match):
    schedules.make_schedule(_cfg(**overrides), PEAK)
