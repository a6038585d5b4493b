"""Tests for composer_jax.rl.teacher_weights."""

import numpy as np
import pytest

from composer_jax.rl import teacher_weights as tw
from composer_jax.rl.config import default_loss_config


def test_ema_update_matches_formula():
  params = {"a": np.array([1.0, 2.0], np.float32), "b": np.array(3.0, np.float32)}
  state = tw.ema_init(params)
  new = {"a": np.array([3.0, 0.0], np.float32), "b": np.array(-1.0, np.float32)}
  for _ in range(2):
    state = tw.ema_update(state, new, 0.25)
  # Two steps towards a fixed target: target + (1 - rate)^2 (init - target).
  np.testing.assert_allclose(state.params["a"], [3.0 - 2.0 * 0.5625, 0.0 + 2.0 * 0.5625])
  np.testing.assert_allclose(state.params["b"], -1.0 + 4.0 * 0.5625)
  with pytest.raises(ValueError, match="ema rate 0.0"):
    tw.ema_update(state, new, 0.0)


@pytest.mark.parametrize(
  "teacher,expected,weights",
  [
    ("live", ("cur",), (1.0,)),
    ("ema", ("ema",), (1.0,)),
    ("frozen", ("init",), (1.0,)),
    ("trust_region", ("init", "cur"), (0.7, 0.3)),
  ],
)
def test_teacher_variables(teacher, expected, weights):
  cfg = default_loss_config()
  cfg.teacher, cfg.trust_region_alpha = teacher, 0.3
  got = tw.teacher_variables(cfg, "cur", ema=tw.EmaState("ema"), initial="init")
  assert got == expected
  np.testing.assert_allclose(tw.mixing_weights(cfg), weights)


def test_errors():
  cfg = default_loss_config()
  cfg.teacher = "frozen"
  with pytest.raises(ValueError, match="needs `initial=`"):
    tw.teacher_variables(cfg, "cur")
  cfg.teacher = "old"
  with pytest.raises(ValueError, match="teacher='old'"):
    tw.mixing_weights(cfg)
  cfg.teacher, cfg.trust_region_alpha = "trust_region", 1.5
  with pytest.raises(ValueError, match="trust_region_alpha=1.5"):
    tw.mixing_weights(cfg)
