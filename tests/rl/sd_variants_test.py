"""rl.sd_variants: which flagged turns each variant teaches and what its teacher reads."""

import numpy as np
import pytest

from composer_jax.rl import sd_variants
from composer_jax.rl.teacher import DistillTarget
from composer_jax.rl.trajectory import Trajectory, Turn


def _trajs():
  turns = lambda a: [Turn([1, 3]), Turn([6, a], [-0.5] * 2), Turn([4]), Turn([6, 9], [-0.7] * 2)]
  return [
    Trajectory.from_turns(turns(7), 0.0, 0),  # a failure with a successful sibling (row 1)
    Trajectory.from_turns(turns(8), 1.0, 0),  # the group's only success
    Trajectory.from_turns(turns(7), 0.0, 1),  # a failure whose group never succeeds
  ]


FLAGGED = [DistillTarget(0, 1, (10,)), DistillTarget(1, 3, (11,)), DistillTarget(2, 1, (12,))]


@pytest.mark.parametrize("variant", ["hint", "rlvr"])
def test_hint_and_rlvr_teach_every_flagged_turn_with_its_hint(variant):
  got = sd_variants.distill_targets(variant, FLAGGED, _trajs(), success_reward=1.0, demo_tokens=48)
  assert got == FLAGGED


def test_sdpo_shows_a_successful_sibling_and_never_a_success_its_own():
  got = sd_variants.distill_targets("sdpo", FLAGGED, _trajs(), success_reward=1.0, demo_tokens=3)
  # Row 0 reads its hint + the first 3 model tokens of row 1 (6 8 6); row 1 is the only success
  # of its group (it is never its own teacher) and row 2's group has none: both untaught.
  assert got == [DistillTarget(0, 1, (10, 6, 8, 6))]
  np.testing.assert_array_equal(sd_variants.model_tokens(_trajs()[1]), [6, 8, 6, 9])


def test_unknown_variant():
  with pytest.raises(ValueError, match=r"sd_variant='opsd'; valid: \['hint', 'rlvr', 'sdpo'\]"):
    sd_variants.distill_targets("opsd", FLAGGED, _trajs(), success_reward=1.0, demo_tokens=3)
