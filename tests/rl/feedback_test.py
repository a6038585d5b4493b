"""rl.feedback: kinds built from an environment's registry, per-turn hints merged in kind order."""

import pytest

from composer_jax.rl.episodes import Episode
from composer_jax.rl.feedback import flag_turns, make_feedback, model_turns
from composer_jax.rl.trajectory import Trajectory, Turn


def _flags(turns, hint):
  """A kind that flags fixed turns with one hint."""
  return lambda env, episode: [(k, [hint]) for k in turns]


REGISTRY = {"a": lambda turns=(1,): _flags(turns, 10), "b": lambda: _flags((3, 1), 20)}


def test_kinds_built_with_their_options_and_hints_merged_in_kind_order():
  feedbacks = make_feedback(REGISTRY, ["b", "a"], {"a": {"turns": (1, 5)}})
  # Turn 1 flagged by both kinds: one row, b's hint first (the order the kinds were given).
  assert flag_turns(feedbacks, None, None) == [(1, [20, 10]), (3, [20]), (5, [10])]


def test_bad_kinds_name_the_valid_ones():
  with pytest.raises(ValueError, match=r"unknown feedback kinds \['c'\]; valid: \['a', 'b'\]"):
    make_feedback(REGISTRY, ["a", "c"])
  with pytest.raises(ValueError, match=r"unknown feedback kinds \['nope'\]"):
    make_feedback(REGISTRY, ["a"], {"nope": {}})
  with pytest.raises(ValueError, match="at least one feedback kind"):
    make_feedback(REGISTRY, [])


def test_model_turns_are_the_sampled_turns():
  traj = Trajectory.from_turns(
    [Turn([1, 2]), Turn([3, 4], [0.0, 0.0]), Turn([5]), Turn([6], [0.0])], 1.0, 0
  )
  got = [(k, list(ids)) for k, ids in model_turns(Episode(traj, None, None))]
  assert got == [(1, [3, 4]), (3, [6])]
