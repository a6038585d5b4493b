"""rl.update: the per-term gradient norms it logs equal gradients computed separately."""

import jax
import ml_collections
import numpy as np
import optax
import pytest

from composer_jax.envs.toolcall import probe_contexts
from composer_jax.model import transformer
from composer_jax.model.config import model_config
from composer_jax.rl.update import make_update
from experiments.configs import rl_tool_feedback
from experiments.tool_feedback import program


def _keep_grads() -> optax.GradientTransformation:
  """An 'optimizer' whose state after an update is exactly that update's gradient."""
  return optax.GradientTransformation(
    lambda p: jax.tree.map(np.zeros_like, p),
    lambda g, state, params=None: (jax.tree.map(lambda x: 0 * x, g), g),
  )


@pytest.mark.slow
def test_term_grad_norms_equal_separately_computed_grads():
  config = rl_tool_feedback.get_config("sd")
  config.model.update(vocab_size=64, num_layers=1)
  model_cfg, env = model_config(config.model), program.make_env(config)
  r = config.rl
  ps = probe_contexts.probe_set(
    env,
    np.random.default_rng(5),
    4,
    seq_len=r.seq_len,
    teacher_seq_len=r.teacher_seq_len,
    turn_len=r.max_new_tokens,
  )
  # One group with unequal rewards: both terms have a gradient.
  rewards = np.array([1.0, 0.0, 0.5, 0.0], np.float32)
  batch = dict(ps["batch"], group_index=np.zeros(4, np.int32), reward=rewards)
  tb = {k: v for k, v in ps["teacher_batch"].items() if k not in ("probe_slot", "good_id")}
  variables = transformer.init(model_cfg, jax.random.key(0))
  teacher = (transformer.init(model_cfg, jax.random.key(1))["params"],)
  tx = _keep_grads()

  def grads(**fields):
    cfg = ml_collections.ConfigDict(config.loss.to_dict())
    cfg.update(fields)
    update = make_update(model_cfg, ml_collections.FrozenConfigDict(cfg), tx)[0]
    params = variables["params"]
    _, g, metrics = jax.jit(update)(
      params, tx.init(params), variables["router"], batch, teacher, tb
    )
    return g, metrics

  g_total, metrics = grads(sd_coef=0.5, log_term_grads=True)
  g_rl, _ = grads(sd_coef=0.0, log_term_grads=False)
  g_one, _ = grads(sd_coef=1.0, log_term_grads=False)
  g_sd = jax.tree.map(lambda a, b: a - b, g_one, g_rl)
  norm, dot = optax.tree.norm, optax.tree.vdot
  assert float(norm(g_rl)) > 1e-4 and float(norm(g_sd)) > 1e-4
  np.testing.assert_allclose(metrics["rl_grad_norm"], norm(g_rl), rtol=1e-3)
  np.testing.assert_allclose(metrics["sd_grad_norm"], norm(g_sd), rtol=1e-3)
  cos = dot(g_rl, g_sd) / (norm(g_rl) * norm(g_sd))
  np.testing.assert_allclose(metrics["rl_sd_grad_cos"], cos, rtol=1e-3, atol=1e-4)
  want = jax.tree.map(lambda a, b: a + 0.5 * b, g_rl, g_sd)
  np.testing.assert_allclose(norm(g_total), norm(want), rtol=1e-3)
  np.testing.assert_allclose(metrics["grad_norm"], norm(want), rtol=1e-3)
