"""RoPE / YaRN against HF transformers `DeepseekV3` (torch, float32)."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds

from composer_jax.model import rope
from composer_jax.model.config import RopeScaling, get_preset
from tests.model import hf_reference

_CONFIGS = {
  "tiny": get_preset("tiny"),
  "deepseek_v3": get_preset("deepseek_v3"),
  "kimi_k2": get_preset("kimi_k2"),
  "no_scaling": get_preset("tiny", rope_scaling=None),
  # mscale_all_dim = 0: HF falls back to mscale(factor) on cos/sin, no softmax factor.
  "mscale_only": get_preset(
    "tiny",
    rope_scaling=RopeScaling(
      factor=8.0,
      original_max_position_embeddings=128,
      beta_fast=16.0,
      beta_slow=2.0,
      mscale=0.7,
      mscale_all_dim=0.0,
    ),
  ),
  "mscale_differs": get_preset(
    "tiny",
    rope_scaling=RopeScaling(
      factor=16.0, original_max_position_embeddings=64, mscale=1.0, mscale_all_dim=0.707
    ),
  ),
}


def _hf_rotary(cfg):
  return hf_ds.DeepseekV3RotaryEmbedding(hf_reference.hf_config(cfg))


@pytest.mark.parametrize("name", sorted(_CONFIGS))
def test_inverse_frequencies_and_attention_factor_match_hf(name):
  cfg = _CONFIGS[name]
  hf = _hf_rotary(cfg)
  inv_freq, factor = rope.inverse_frequencies(
    cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling
  )
  chex.assert_trees_all_close(inv_freq, hf.inv_freq.numpy(), rtol=1e-6)
  assert factor == pytest.approx(hf.attention_scaling, rel=1e-12)


@pytest.mark.parametrize("name", sorted(_CONFIGS))
def test_softmax_scale_matches_hf(name):
  cfg = _CONFIGS[name]
  attn = hf_ds.DeepseekV3Attention(hf_reference.hf_config(cfg), layer_idx=0)
  assert rope.softmax_scale(cfg.qk_head_dim, cfg.rope_scaling) == pytest.approx(
    attn.scaling, rel=1e-12
  )


def test_yarn_mscale_hand_values():
  assert rope.yarn_mscale(1.0, 5.0) == 1.0
  assert rope.yarn_mscale(40.0, 1.0) == pytest.approx(0.1 * np.log(40.0) + 1.0)


@pytest.mark.parametrize("name", ["tiny", "mscale_differs"])
def test_apply_rope_matches_hf_interleaved(name):
  cfg = _CONFIGS[name]
  hf = _hf_rotary(cfg)
  rng = np.random.default_rng(0)
  b, length, h, dr = 2, 7, 3, cfg.qk_rope_head_dim
  positions = rng.integers(0, 300, size=(b, length))
  q = rng.standard_normal((b, length, h, dr), dtype=np.float32)
  k = rng.standard_normal((b, length, 1, dr), dtype=np.float32)
  cos_t, sin_t = hf(torch.zeros(1), torch.from_numpy(positions))
  # HF is [batch, heads, seq, dim].
  want_q, want_k = hf_ds.apply_rotary_pos_emb_interleave(
    hf_reference.to_torch(q).transpose(1, 2), hf_reference.to_torch(k).transpose(1, 2), cos_t, sin_t
  )
  cos, sin = rope.rope_tables(jnp.asarray(positions), dr, cfg.rope_theta, cfg.rope_scaling)
  chex.assert_trees_all_close(
    rope.apply_rope(jnp.asarray(q), cos, sin), want_q.transpose(1, 2).numpy(), atol=2e-5
  )
  chex.assert_trees_all_close(
    rope.apply_rope(jnp.asarray(k), cos, sin), want_k.transpose(1, 2).numpy(), atol=2e-5
  )


def test_rope_is_relative():
  """q.k after RoPE depends only on the position difference (the point of RoPE)."""
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.standard_normal((1, 1, 1, 8), dtype=np.float32))
  k = jnp.asarray(rng.standard_normal((1, 1, 1, 8), dtype=np.float32))

  def score(pq, pk):
    cq, sq = rope.rope_tables(jnp.array([[pq]]), 8, 10000.0, None)
    ck, sk = rope.rope_tables(jnp.array([[pk]]), 8, 10000.0, None)
    return float(jnp.sum(rope.apply_rope(q, cq, sq) * rope.apply_rope(k, ck, sk)))

  assert score(5, 2) == pytest.approx(score(13, 10), rel=1e-5)
