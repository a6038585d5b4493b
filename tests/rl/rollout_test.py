"""The RL rollout pieces: sampler-driven episodes (deterministic per seed), padding teacher rows
(add nothing to the loss), episode metrics by hand, the env words in the model vocab."""

import jax
import ml_collections
import numpy as np
import pytest

from composer_jax.envs.toolcall.env import EpisodeState, ToolTask
from composer_jax.model import transformer
from composer_jax.model.config import model_config
from composer_jax.rl import losses, rollout
from composer_jax.rl.config import default_loss_config
from composer_jax.rl.episodes import Episode, run_episodes
from composer_jax.rl.trajectory import Trajectory, Turn, pack_batch
from experiments.configs import rl_tool_feedback
from experiments.tool_feedback import program
from tests.rl import episode_checks


def test_sampled_episodes_are_deterministic_given_a_seed():
  config = rl_tool_feedback.get_config("sd")
  model_cfg, env = model_config(config.model), program.make_env(config)
  variables = transformer.init(model_cfg, jax.random.key(0))
  policy = rollout.make_policy(model_cfg, config.rl, env.stop_ids, env.pad_id)

  def play(task_seed, key):
    rng = np.random.default_rng(task_seed)
    tasks = [env.sample_task(rng) for _ in range(4)]
    return run_episodes(
      env,
      tasks,
      [0, 0, 1, 1],
      lambda p, n, k: policy(variables, p, n, k),
      jax.random.key(key),
      prompt_len=config.rl.prompt_len,
    )

  a, b, c = play(0, 1), play(0, 1), play(0, 2)
  episode_checks.assert_same_episodes(a, b)
  episode_checks.assert_some_episode_differs(a, c)
  # Sampled log-probs are of the tokens kept: log-probs of model tokens are < 0, others 0.
  t = a[0].trajectory
  assert (t.sampler_logprobs[t.model_mask] < 0).all() and (
    t.sampler_logprobs[~t.model_mask] == 0
  ).all()


def test_empty_teacher_batch_adds_nothing():
  cfg = default_loss_config()
  cfg.vocab_chunk_size = 16
  loss_fn = losses.make_loss_fn(ml_collections.FrozenConfigDict(cfg))
  turns = [Turn([1, 2, 3]), Turn([4, 5], [-1.0, -2.0]), Turn([6])]
  trajs = [Trajectory.from_turns(turns, r, 0) for r in (0.0, 1.0)]
  batch = pack_batch(trajs, [8])
  kh, kw, kt = jax.random.split(jax.random.key(0), 3)
  hidden = jax.random.normal(kh, (2, 8, 4))
  head = jax.random.normal(kw, (4, 32))
  teacher = ((jax.random.normal(kt, (3, 8, 4)), head),)
  empty = rollout.empty_teacher_batch(3, 8, 2)
  rl_only, _ = loss_fn(hidden, head, batch)
  both, metrics = loss_fn(hidden, head, batch, teacher, empty)
  np.testing.assert_allclose(both, rl_only, rtol=1e-6)
  assert metrics["sd_loss"] == 0 and metrics["num_distilled_tokens"] == 0
  g = jax.grad(lambda h: loss_fn(h, head, batch, teacher, empty)[0])(hidden)
  g_rl = jax.grad(lambda h: loss_fn(h, head, batch)[0])(hidden)
  np.testing.assert_allclose(g, g_rl, rtol=1e-6, atol=1e-9)


def test_episode_metrics_by_hand():
  task = ToolTask(("mail",), ("message",))
  states = [
    EpisodeState(task, calls=2, unavailable_calls=1, model_turns=3, answered=True, done=True),
    EpisodeState(task, calls=2, unavailable_calls=0, model_turns=3, done=True),
    EpisodeState(task, calls=0, model_turns=1, answered=True, verbose_answer=True, done=True),
  ]
  rewards = [1.0, 0.0, 0.0]
  episodes = [
    Episode(Trajectory.from_turns([Turn([1, 2]), Turn([3], [-1.0])], r, 0), s, task)
    for s, r in zip(states, rewards, strict=True)
  ]
  m = program.make_env(rl_tool_feedback.get_config("sd")).episode_metrics(episodes)
  assert m == dict(
    reward=1 / 3,
    unavailable_rate=1 / 4,
    verbose_rate=1 / 2,
    calls_per_episode=4 / 3,
    model_turns_per_episode=7 / 3,
  )


def test_model_vocab_must_hold_the_env_words():
  config = rl_tool_feedback.get_config("rl")
  config.model.vocab_size = 16
  with pytest.raises(ValueError, match="vocab_size=16 must be >= the environment vocabulary"):
    program.make_env(config)
  with pytest.raises(ValueError, match="arm='beta'"):
    rl_tool_feedback.get_config("beta")
