"""Tests for the tool-calling environment: hand-played episodes, rewards, tool-not-found."""

import numpy as np
import pytest

from composer_jax.envs.toolcall.env import ToolEnv, ToolTask
from composer_jax.envs.toolcall.vocab import CAPABILITIES, Vocab

VOCAB = Vocab()
TASK = ToolTask(available=("forecast", "stocks", "mail"), required=("temperature", "message"))


def _play(env, task, turns):
  state, first = env.reset(task)
  replies = []
  for words in turns:
    state, reply = env.step(state, VOCAB.encode(words))
    replies.append(" ".join(VOCAB.decode(reply)))
  return state, first, replies


def test_unavailable_tool_is_an_error_and_the_episode_continues():
  env = ToolEnv(VOCAB, max_model_turns=4)
  state, first, replies = _play(
    env, TASK, ["call weather <eot>", "call forecast <eot>", "call mail <eot>", "answer <eot>"]
  )
  assert VOCAB.decode(first) == (
    "<bos> tools: forecast stocks mail task: temperature message <eot>".split()
  )
  assert replies == [
    "error weather not_found <eot>",
    "result temperature <eot>",
    "result message <eot>",
    "",
  ]
  assert (state.calls, state.unavailable_calls, state.model_turns) == (3, 1, 4)
  assert state.done and state.answered and env.reward(state) == 1.0


@pytest.mark.parametrize(
  "turns, reward, unavailable",
  [
    (["call forecast <eot>", "answer <eot>"], 0.0, 0),  # answered without `message`
    (["call mail <eot>", "call forecast <eot>", "call stocks <eot>", "answer <eot>"], 1.0, 0),
    # Two unavailable calls use up the 4-turn budget before the answer.
    (["call email <eot>", "call weather <eot>", "call mail <eot>", "call forecast <eot>"], 0.0, 2),
    (["call <eot>", "call mail <eot>", "call forecast <eot>", "answer <eot>"], 1.0, 0),
  ],
)
def test_reward_is_task_success(turns, reward, unavailable):
  env = ToolEnv(VOCAB, max_model_turns=4)
  state, _, _ = _play(env, TASK, turns)
  assert state.done and env.reward(state) == reward
  assert state.unavailable_calls == unavailable


def test_bad_format_and_finished_episode():
  env = ToolEnv(VOCAB, max_model_turns=2)
  state, _, replies = _play(env, TASK, ["call call <eot>"])
  assert replies == ["error bad_format <eot>"] and state.calls == 0
  assert env.parse(VOCAB.encode("call forecast")) == ("bad_format", None)  # no <eot>
  call, eot = VOCAB.encode("call <eot>")
  assert env.parse([call, VOCAB.size + 5, eot]) == ("bad_format", None)  # id past the env words
  state, reply = env.step(state, VOCAB.encode("call mail <eot>"))
  assert state.done and reply == [] and env.reward(state) == 0.0
  with pytest.raises(ValueError, match="finished episode"):
    env.step(state, VOCAB.encode("answer <eot>"))


def test_sample_task_is_seeded_and_consistent():
  env = ToolEnv(VOCAB, min_tools=3, max_tools=5, max_required=2)
  a = [env.sample_task(np.random.default_rng(7)) for _ in range(2)]
  assert a[0] == a[1]
  rng = np.random.default_rng(0)
  for _ in range(200):
    task = env.sample_task(rng)
    assert 3 <= len(task.available) <= 5 and 1 <= len(task.required) <= 2
    offered = [c for c, pair in CAPABILITIES.items() if set(pair) & set(task.available)]
    assert len(offered) == len(task.available)  # one alias per offered capability
    assert set(task.required) <= set(offered)
  assert "reminder: available forecast stocks mail <eot>".split() == VOCAB.decode(env.hint(TASK))
  assert "reminder: available forecast <eot>".split() == VOCAB.decode(env.hint(TASK, "weather"))
  with pytest.raises(ValueError, match="unknown tool 'call'"):
    env.hint(TASK, "call")


def test_first_alias_prob_biases_the_offer():
  rng = np.random.default_rng(0)
  firsts = total = 0
  for _ in range(300):
    task = ToolEnv(VOCAB, first_alias_prob=0.8).sample_task(rng)
    firsts += sum(t in [p[0] for p in CAPABILITIES.values()] for t in task.available)
    total += len(task.available)
  assert 0.75 < firsts / total < 0.85
  always = ToolEnv(VOCAB, first_alias_prob=1.0).sample_task(rng)
  assert all(t in [p[0] for p in CAPABILITIES.values()] for t in always.available)


@pytest.mark.parametrize(
  "kw, match",
  [
    (dict(min_tools=0), "min_tools"),
    (dict(max_tools=7), "max_tools"),
    (dict(max_required=4, min_tools=3), "max_required"),
    (dict(max_model_turns=1), "max_model_turns"),
    (dict(first_alias_prob=1.5), "first_alias_prob"),
  ],
)
def test_bad_env_arguments(kw, match):
  with pytest.raises(ValueError, match=match):
    ToolEnv(VOCAB, **kw)


def test_vocab_round_trip_and_errors():
  ids = VOCAB.encode("call weather <eot>")
  assert VOCAB.decode(ids) == ["call", "weather", "<eot>"] and VOCAB.eot_id == ids[-1]
  with pytest.raises(ValueError, match="not in the vocabulary"):
    VOCAB.encode("call teleport")
  with pytest.raises(ValueError, match="outside the vocabulary"):
    VOCAB.decode([VOCAB.size])
