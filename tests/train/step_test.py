"""The train step against a direct full-batch reference: gradient accumulation, token
weighting, router-bias update and metrics."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from composer_jax.model import loss as loss_lib
from composer_jax.model import moe, transformer
from composer_jax.model.config import get_preset
from composer_jax.train import step as step_lib
from composer_jax.train.state import init_state

B, L, G, RATE = 4, 32, 2, 1e-3
_INPUTS = ("tokens", "segment_ids", "positions")


def _batch(cfg):
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, cfg.vocab_size, (B, L), dtype=np.int32)
  mask = np.ones((B, L), np.float32)
  mask[0, 20:] = 0.0  # Micro-batches with different token counts: weighting matters.
  mask[3, 5:] = 0.0
  return {
    "tokens": tokens,
    "targets": np.roll(tokens, -1, axis=1),
    "loss_mask": mask,
    "segment_ids": np.ones((B, L), np.int32),
    "positions": np.broadcast_to(np.arange(L, dtype=np.int32), (B, L)).copy(),
  }


@pytest.mark.slow
@pytest.mark.parametrize("dense_layers", [None, 3], ids=["moe", "dense_only"])
def test_accumulated_step_equals_full_batch_sgd_step(dense_layers):
  overrides = {} if dense_layers is None else {"first_k_dense_replace": dense_layers}
  cfg = get_preset("tiny", **overrides)
  optimizer = optax.sgd(1.0)  # new params = params - grads
  state = init_state(cfg, optimizer, jax.random.PRNGKey(0))
  labels = jax.tree.map(lambda _: "adamw", state.params)
  batch = _batch(cfg)

  def reference_loss(params):
    hidden, aux = transformer.forward(
      cfg,
      {"params": params, "router": state.router},
      batch["tokens"],
      batch["segment_ids"],
      batch["positions"],
    )
    loss, _ = loss_lib.chunked_cross_entropy(
      hidden,
      transformer.output_head(cfg, params),
      batch["targets"],
      batch["loss_mask"],
      chunk_size=64,
      z_loss_coef=1e-4,
    )
    return loss, aux

  (ref_loss, ref_aux), ref_grads = jax.jit(jax.value_and_grad(reference_loss, has_aux=True))(
    state.params
  )
  ref_params = jax.tree.map(lambda p, g: p - g, state.params, ref_grads)

  train_step = jax.jit(
    step_lib.make_train_step(
      cfg,
      optimizer,
      optax.constant_schedule(1.0),
      labels,
      loss_chunk=64,
      z_loss=1e-4,
      router_bias_rate=RATE,
    )
  )
  micro = jax.tree.map(lambda x: x.reshape(G, B // G, L), batch)
  new_state, metrics = train_step(state, micro)

  np.testing.assert_allclose(metrics["loss"], ref_loss, rtol=1e-5)
  # z-loss by hand: mean over counted tokens of logsumexp(logits)^2, logged times its coef.
  hidden, _ = transformer.forward(
    cfg, {"params": state.params, "router": state.router}, *(batch[k] for k in _INPUTS)
  )
  logits = np.asarray(hidden @ transformer.output_head(cfg, state.params), np.float64)
  lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  logz_sq = (lse**2 * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
  np.testing.assert_allclose(metrics["logz_sq"], logz_sq, rtol=1e-4)
  np.testing.assert_allclose(metrics["z_loss"], 1e-4 * logz_sq, rtol=1e-4)
  np.testing.assert_allclose(metrics["num_tokens"], batch["loss_mask"].sum())
  np.testing.assert_allclose(metrics["grad_norm"], optax.tree.norm(ref_grads), rtol=1e-4)
  chex.assert_trees_all_close(new_state.params, ref_params, atol=1e-6, rtol=1e-4)
  assert int(new_state.step) == 1
  np.testing.assert_allclose(
    metrics["update_rms/adamw"],
    jnp.sqrt(
      sum(jnp.sum(g**2) for g in jax.tree.leaves(ref_grads))
      / sum(g.size for g in jax.tree.leaves(ref_grads))
    ),
    rtol=1e-4,
  )
  if cfg.num_moe_layers == 0:  # no router: no bias to update, no load metrics
    assert "moe_layers" not in new_state.router and "moe/load_max_over_mean" not in metrics
    return
  ref_bias = moe.update_router_bias(
    state.router["moe_layers"]["moe"]["bias"], ref_aux["router_counts"], RATE
  )
  chex.assert_trees_all_equal(new_state.router["moe_layers"]["moe"]["bias"], ref_bias)
  counts = np.asarray(ref_aux["router_counts"])
  load = counts.max(-1) / counts.mean(-1)
  np.testing.assert_allclose(metrics["moe/load_max_over_mean"], load.mean(), rtol=1e-5)
