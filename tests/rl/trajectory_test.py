"""Tests for composer_jax.rl.trajectory against hand-built expected arrays."""

import numpy as np
import pytest

from composer_jax.rl.trajectory import Trajectory, Turn, bucket_length, pack_batch


def _traj(group_id=0, reward=1.0):
  return Trajectory.from_turns(
    [Turn([1, 2]), Turn([3, 4], [-0.5, -0.25]), Turn([5]), Turn([6], [-1.0])], reward, group_id
  )


def test_from_turns_fields():
  t = _traj()
  np.testing.assert_array_equal(t.tokens, [1, 2, 3, 4, 5, 6])
  np.testing.assert_array_equal(t.model_mask, [0, 0, 1, 1, 0, 1])
  np.testing.assert_array_equal(t.turn_ids, [0, 0, 1, 1, 2, 3])
  np.testing.assert_allclose(t.sampler_logprobs, [0, 0, -0.5, -0.25, 0, -1.0])
  assert t.num_turns == 4 and t.turn_span(1) == (2, 4)
  assert [t.is_model_turn(k) for k in range(4)] == [False, True, False, True]


def test_pack_batch_shift_and_padding():
  short = Trajectory.from_turns([Turn([7]), Turn([8], [-0.1])], 0.0, group_id=5)
  batch = pack_batch(
    [_traj(group_id=5), short, _traj(group_id=9)], buckets=[4, 8, 16], batch_size=4, pad_id=99
  )
  assert batch["tokens"].shape == (4, 8)  # longest trajectory has 6 tokens -> bucket 8
  np.testing.assert_array_equal(batch["tokens"][0], [1, 2, 3, 4, 5, 6, 99, 99])
  np.testing.assert_array_equal(batch["targets"][0], [2, 3, 4, 5, 6, 99, 99, 99])
  np.testing.assert_array_equal(batch["model_mask"][0], [0, 1, 1, 0, 1, 0, 0, 0])
  np.testing.assert_allclose(batch["sampler_logprobs"][0], [0, -0.5, -0.25, 0, -1.0, 0, 0, 0])
  np.testing.assert_array_equal(batch["turn_ids"][0], [0, 1, 1, 2, 3, -1, -1, -1])
  np.testing.assert_array_equal(batch["segment_ids"][1], [1, 1, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(batch["positions"][0], np.arange(8))
  np.testing.assert_array_equal(batch["group_index"], [0, 0, 1, 0])
  np.testing.assert_array_equal(batch["valid"], [1, 1, 1, 0])
  np.testing.assert_array_equal(batch["model_mask"][3], np.zeros(8))


@pytest.mark.parametrize("n,expected", [(1, 4), (4, 4), (5, 16), (16, 16)])
def test_bucket_length(n, expected):
  assert bucket_length(n, [16, 4]) == expected


def test_errors():
  with pytest.raises(ValueError, match="exceeds the largest bucket 4"):
    pack_batch([_traj()], buckets=[4])
  with pytest.raises(ValueError, match="first token cannot be a model token"):
    Trajectory.from_turns([Turn([1], [-0.1]), Turn([2])], 0.0, 0)
  with pytest.raises(ValueError, match="turn_ids must start at 0"):
    Trajectory([1, 2], [0, 0], [0, 0], [0, 2], 0.0, 0)
  with pytest.raises(ValueError, match="model_mask has shape"):
    Trajectory([1, 2], [0, 0], [0], [0, 0], 0.0, 0)
  with pytest.raises(ValueError, match="batch_size 1 < number of trajectories 2"):
    pack_batch([_traj(), _traj()], buckets=[8], batch_size=1)
