"""Tests for targeted text feedback: faulty turns found, hints written, teacher rows aligned."""

import numpy as np
import pytest

from composer_jax.envs.toolcall.env import ToolEnv, ToolTask
from composer_jax.envs.toolcall.feedback import FEEDBACK_KINDS
from composer_jax.envs.toolcall.vocab import Vocab
from composer_jax.rl import env as rl_env
from composer_jax.rl.episodes import Episode
from composer_jax.rl.feedback import make_feedback
from composer_jax.rl.teacher import build_teacher_batch
from composer_jax.rl.trajectory import Trajectory, Turn, pack_batch

VOCAB = Vocab()
ENV = ToolEnv(VOCAB, max_model_turns=5)
TASK = ToolTask(available=("forecast", "mail", "lookup"), required=("temperature",))


def distill_targets(kinds, options, episodes):
  """The RL program's targets (`rl.env.distill_targets`) of a ToolEnv with these kinds."""
  env = ToolEnv(VOCAB, max_model_turns=5, feedback_kinds=kinds, feedback_options=options)
  assert isinstance(env, rl_env.Env)
  return rl_env.distill_targets(env, episodes)


def _episode(model_turns, task=TASK):
  """Plays `model_turns` (word strings) through ENV, as a sampler would have produced them."""
  state, first = ENV.reset(task)
  turns = [Turn(first)]
  for words in model_turns:
    ids = VOCAB.encode(words)
    turns.append(Turn(ids, [-0.5] * len(ids)))
    state, reply = ENV.step(state, ids)
    if reply:
      turns.append(Turn(reply))
  return Episode(Trajectory.from_turns(turns, ENV.reward(state), 0), state, task)


EPISODES = [
  # turns: 0 system, 1 weather (unavailable), 2 error, 3 forecast, 4 result, 5 answer
  _episode(["call weather <eot>", "call forecast <eot>", "answer <eot>"]),
  # turns: 0, 1 forecast, 2 result, 3 over-long answer, 4 error, 5 search (unavailable)
  _episode(["call forecast <eot>", "answer answer answer <eot>", "call search <eot>"]),
  _episode(["call forecast <eot>", "answer <eot>"]),  # nothing to flag
]
HINT = "reminder: available forecast <eot>"  # weather -> the offered temperature tool
HINT_FACT = "reminder: available lookup <eot>"  # search -> the offered fact tool
SHORT = "reminder: keep messages short <eot>"


def test_unavailable_tool_targets():
  targets = distill_targets(["unavailable_tool"], None, EPISODES)
  got = [(t.trajectory_index, t.turn, " ".join(VOCAB.decode(t.hint))) for t in targets]
  assert got == [(0, 1, HINT), (1, 5, HINT_FACT)]
  every = distill_targets(["unavailable_tool"], {"unavailable_tool": {"all_tools": True}}, EPISODES)
  assert {" ".join(VOCAB.decode(t.hint)) for t in every} == {
    "reminder: available forecast mail lookup <eot>"
  }


def test_second_kind_and_merged_hints():
  got = [
    (t.trajectory_index, t.turn, " ".join(VOCAB.decode(t.hint)))
    for t in distill_targets(
      ["unavailable_tool", "overlong_message"], {"overlong_message": {"max_tokens": 3}}, EPISODES
    )
  ]
  assert got == [(0, 1, HINT), (1, 3, SHORT), (1, 5, HINT_FACT)]
  # The same turn flagged by two kinds gets one teacher row, hints in the order of the kinds.
  both = distill_targets(
    ["overlong_message", "unavailable_tool"], {"overlong_message": {"max_tokens": 2}}, EPISODES[:1]
  )
  assert [(t.turn, " ".join(VOCAB.decode(t.hint))) for t in both] == [
    (1, f"{SHORT} {HINT}"),
    (3, SHORT),
  ]


def test_targets_point_at_model_turns_that_align():
  trajs = [e.trajectory for e in EPISODES]
  student = pack_batch(trajs, [48], pad_id=VOCAB.pad_id)
  targets = distill_targets(["unavailable_tool"], None, EPISODES)
  # build_teacher_batch runs check_alignment: it raises unless student and teacher slots hold
  # the same sampled tokens.
  tb = build_teacher_batch(trajs, student, targets, buckets=[48], turn_buckets=[4], num_rows=4)
  for row, target in enumerate(targets):
    traj = trajs[target.trajectory_index]
    assert traj.is_model_turn(target.turn)
    start, end = traj.turn_span(target.turn)
    hint = list(target.hint)
    stream = list(traj.tokens[:start]) + hint + list(traj.tokens[start:end])
    np.testing.assert_array_equal(tb["tokens"][row, : len(stream)], stream)
    np.testing.assert_array_equal(tb["slot_target"][row, :3], traj.tokens[start:end])
  assert tb["slot_mask"].sum() == 6


def test_bad_feedback_config():
  with pytest.raises(ValueError, match="unknown feedback kinds \\['style'\\]"):
    make_feedback(FEEDBACK_KINDS, ["style"])
  with pytest.raises(ValueError, match="unknown feedback kinds"):
    make_feedback(FEEDBACK_KINDS, ["unavailable_tool"], {"nope": {}})
  with pytest.raises(ValueError, match="at least one feedback kind"):
    make_feedback(FEEDBACK_KINDS, [])
  with pytest.raises(ValueError, match="max_tokens=0"):
    make_feedback(FEEDBACK_KINDS, ["overlong_message"], {"overlong_message": {"max_tokens": 0}})
