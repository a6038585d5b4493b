"""Tests for composer_jax.rl.advantages against a per-group numpy loop."""

import jax
import numpy as np
import pytest

from composer_jax.rl.advantages import check_groups, group_advantages

REWARDS = np.array([1.0, 0.0, 0.5, 2.0, 3.0, 7.0], np.float32)
GROUPS = np.array([0, 0, 0, 2, 2, 1], np.int32)
VALID = np.array([1, 1, 1, 1, 1, 0], np.float32)


def _reference(normalize_std, eps=1e-6):
  out = np.zeros(len(REWARDS))
  for g in set(GROUPS[VALID > 0].tolist()):
    idx = np.flatnonzero((GROUPS == g) & (VALID > 0))
    r = REWARDS[idx].astype(np.float64)
    out[idx] = (r - r.mean()) / (r.std() + eps) if normalize_std else r - r.mean()
  return out


@pytest.mark.parametrize("normalize_std", [True, False])
def test_group_advantages(normalize_std):
  fn = jax.jit(group_advantages, static_argnames=("num_groups", "normalize_std", "eps"))
  adv = fn(REWARDS, GROUPS, VALID, num_groups=6, normalize_std=normalize_std)
  np.testing.assert_allclose(adv, _reference(normalize_std), rtol=1e-5, atol=1e-6)
  assert adv[5] == 0.0  # invalid row


def test_single_member_and_constant_groups_are_zero_not_nan():
  adv = group_advantages(
    np.array([1.0, 4.0, 4.0]), np.array([0, 1, 1]), np.ones(3), num_groups=3, normalize_std=True
  )
  np.testing.assert_array_equal(adv, np.zeros(3))


def test_check_groups():
  check_groups(GROUPS[:5], VALID[:5], num_groups=3)
  with pytest.raises(ValueError, match=r"groups \[1\] are empty"):
    check_groups(GROUPS, VALID, num_groups=3)
  with pytest.raises(ValueError, match=r"group_index \[3\] outside \[0, 3\)"):
    check_groups(np.array([0, 3]), np.ones(2), num_groups=3)
