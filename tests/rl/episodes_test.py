"""Tests for the multi-turn episode runner with a key-seeded scripted policy."""

import jax
import numpy as np
import pytest

from composer_jax.envs.toolcall.env import ToolEnv, ToolTask
from composer_jax.envs.toolcall.vocab import TOOLS, Vocab
from composer_jax.rl.episodes import run_episodes
from tests.rl import episode_checks

VOCAB = Vocab()
ENV = ToolEnv(VOCAB, max_model_turns=4)
CANDIDATES = [VOCAB.encode(["call", t, "<eot>"]) for t in TOOLS] + [VOCAB.encode("answer <eot>")]


def random_turn_policy(calls):
  """Picks one candidate turn per row from `key`; records what it was asked and returned."""

  def policy(prompts, prompt_lens, key):
    b = prompts.shape[0]
    pick = np.asarray(jax.random.randint(key, (b,), 0, len(CANDIDATES)))
    tokens = np.zeros((b, 3), np.int32)
    lengths = np.array([len(CANDIDATES[i]) for i in pick], np.int32)
    for row, i in enumerate(pick):
      tokens[row, : lengths[row]] = CANDIDATES[i]
    logprobs = np.full((b, 3), -np.log(len(CANDIDATES)), np.float32) - 0.01 * np.arange(3)
    calls.append((prompts.copy(), prompt_lens.copy(), tokens, lengths))
    return tokens, logprobs, lengths

  return policy


def _tasks(seed, n):
  rng = np.random.default_rng(seed)
  return [ENV.sample_task(rng) for _ in range(n)]


def _run(seed, key, calls=None):
  tasks = _tasks(seed, 6)
  policy = random_turn_policy([] if calls is None else calls)
  return run_episodes(ENV, tasks, [0, 0, 0, 1, 1, 1], policy, key, prompt_len=40)


def test_same_seed_same_episodes_other_key_differs():
  a, b = _run(0, jax.random.key(3)), _run(0, jax.random.key(3))
  c = _run(0, jax.random.key(4))
  episode_checks.assert_same_episodes(a, b)
  episode_checks.assert_some_episode_differs(a, c)


def test_trajectories_keep_sampled_ids_and_replay_the_env():
  calls = []
  episodes = _run(1, jax.random.key(0), calls)
  for b, ep in enumerate(episodes):
    traj = ep.trajectory
    assert traj.group_id == [0, 0, 0, 1, 1, 1][b]
    # Replay the env by hand on the model turns stored in the trajectory.
    state, first = ENV.reset(ep.task)
    expected = list(first)
    model = []
    for r in range(traj.num_turns):
      if not traj.is_model_turn(r):
        continue
      start, end = traj.turn_span(r)
      ids = traj.tokens[start:end]
      # The stored ids are the policy's row b output of that round, unchanged.
      _, _, tokens, lengths = calls[len(model)]
      np.testing.assert_array_equal(ids, tokens[b, : lengths[b]])
      expected_logp = -np.log(len(CANDIDATES)) - 0.01 * np.arange(end - start)
      np.testing.assert_allclose(traj.sampler_logprobs[start:end], expected_logp, rtol=1e-6)
      model.append(ids)
      state, reply = ENV.step(state, ids)
      expected += list(ids) + list(reply)
    np.testing.assert_array_equal(traj.tokens, expected)
    assert traj.reward == ENV.reward(state) and state == ep.state
    assert traj.model_mask.sum() == sum(len(m) for m in model)
  # Round r prompts row b with its history so far.
  prompts, lens, _, _ = calls[1]
  first_len = len(ENV.reset(episodes[0].task)[1])
  np.testing.assert_array_equal(prompts[0, :first_len], episodes[0].trajectory.tokens[:first_len])
  assert lens[0] > first_len or episodes[0].state.model_turns == 1


def test_bad_input():
  policy = random_turn_policy([])
  with pytest.raises(ValueError, match="at least one task"):
    run_episodes(ENV, [], [], policy, jax.random.key(0), prompt_len=40)
  with pytest.raises(ValueError, match="2 group ids for 1 tasks"):
    run_episodes(ENV, _tasks(0, 1), [0, 1], policy, jax.random.key(0), prompt_len=40)
  with pytest.raises(ValueError, match="prompt_len 8"):
    run_episodes(ENV, _tasks(0, 2), [0, 0], policy, jax.random.key(0), prompt_len=8)
  task = ToolTask(("mail",), ("message",))

  def empty(prompts, lens, key):
    return np.zeros((1, 3), np.int32), np.zeros((1, 3), np.float32), np.zeros((1,), np.int32)

  with pytest.raises(ValueError, match="empty turn"):
    run_episodes(ENV, [task], [0], empty, jax.random.key(0), prompt_len=40)
