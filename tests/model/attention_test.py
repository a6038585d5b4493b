"""Attention mask by hand; MLA against HF transformers `DeepseekV3Attention`."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds

from composer_jax.model import attention, rope
from composer_jax.model.config import get_preset
from tests.model import hf_reference


def test_attention_mask_by_hand():
  segs = jnp.array([[1, 1, 2, 2, 0]])
  want = np.array(
    [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 0]], bool
  )
  chex.assert_trees_all_equal(attention.attention_mask(segs), jnp.asarray(want)[None, None])


def _hf_weights(cfg, rng):
  """HF `[out, in]` weights and the same kernels in our input-first layout."""
  h, d = cfg.num_heads, cfg.hidden_size
  dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
  w = lambda *s: rng.standard_normal(s, dtype=np.float32) * 0.2
  hf = {
    "kv_a_proj_with_mqa": w(cfg.kv_lora_rank + dr, d),
    "kv_b_proj": w(h * (dn + dv), cfg.kv_lora_rank),
    "o_proj": w(d, h * dv),
    "kv_a_layernorm": 1 + w(cfg.kv_lora_rank),
  }
  ours = {
    "kv_a": {"kernel": hf["kv_a_proj_with_mqa"].T},
    "kv_b": {"kernel": hf["kv_b_proj"].T.reshape(cfg.kv_lora_rank, h, dn + dv)},
    "o": {"kernel": hf["o_proj"].T.reshape(h, dv, d)},
    "kv_norm": {"scale": hf["kv_a_layernorm"]},
  }
  if cfg.q_lora_rank is None:
    hf["q_proj"] = w(h * (dn + dr), d)
    ours["q"] = {"kernel": hf["q_proj"].T.reshape(d, h, dn + dr)}
  else:
    hf.update(
      q_a_proj=w(cfg.q_lora_rank, d),
      q_b_proj=w(h * (dn + dr), cfg.q_lora_rank),
      q_a_layernorm=1 + w(cfg.q_lora_rank),
    )
    ours.update(
      q_a={"kernel": hf["q_a_proj"].T},
      q_b={"kernel": hf["q_b_proj"].T.reshape(cfg.q_lora_rank, h, dn + dr)},
      q_norm={"scale": hf["q_a_layernorm"]},
    )
  return hf, ours


@pytest.mark.parametrize("q_lora_rank", [32, None])
def test_mla_matches_hf(q_lora_rank):
  cfg = get_preset("tiny", q_lora_rank=q_lora_rank)
  rng = np.random.default_rng(0)
  b, length = 2, 9
  hf_w, params = _hf_weights(cfg, rng)
  x = rng.standard_normal((b, length, cfg.hidden_size), dtype=np.float32)
  positions = np.tile(np.arange(length) + 100, (b, 1))

  hf_cfg = hf_reference.hf_config(cfg)
  layer = hf_ds.DeepseekV3Attention(hf_cfg, layer_idx=0)
  with torch.no_grad():
    for name, value in hf_w.items():
      getattr(layer, name).weight.copy_(hf_reference.to_torch(value))
    cos, sin = hf_ds.DeepseekV3RotaryEmbedding(hf_cfg)(torch.zeros(1), torch.from_numpy(positions))
    causal = torch.full((length, length), float("-inf")).triu(1)[None, None]
    want, _ = layer(hf_reference.to_torch(x), (cos, sin), causal)

  cos_j, sin_j = rope.rope_tables(
    jnp.asarray(positions), cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling
  )
  mask = attention.attention_mask(jnp.ones((b, length), jnp.int32))
  got = attention.MLA(cfg).apply(
    {"params": jax.tree.map(jnp.asarray, params)}, jnp.asarray(x), cos_j, sin_j, mask
  )
  chex.assert_trees_all_close(got, want.numpy(), atol=1e-4, rtol=1e-4)


def _packed_case(seed):
  """Two packed documents and trailing padding in row 0, one document in row 1; L = 13.
  Returns segs, q, k, v and a cotangent that is 0 at padding (padding outputs differ by
  implementation; the loss never sees them)."""
  b, length, h, dk, dv = 2, 13, 3, 6, 4
  segs = jnp.array([[1] * 5 + [2] * 6 + [0] * 2, [3] * 13])
  rng = np.random.default_rng(seed)
  q, k = (jnp.asarray(rng.standard_normal((b, length, h, dk), dtype=np.float32)) for _ in range(2))
  v = jnp.asarray(rng.standard_normal((b, length, h, dv), dtype=np.float32))
  cot = jnp.asarray(rng.standard_normal((b, length, h, dv), dtype=np.float32))
  return segs, q, k, v, cot * (segs != 0)[..., None, None]


@pytest.mark.parametrize("impl,block", [("blocked", 4), ("blocked", 16), ("jax_nn", 0)])
def test_segment_mask_impls_match_reference_values_and_grads(impl, block):
  # L = 13 is not a multiple of the block; padding queries: reference uniform, blocked 0.
  segs, q, k, v, cot = _packed_case(0)
  mask = attention.SegmentMask(segs)
  got_fn = lambda q, k, v: jnp.sum(
    cot * attention.dot_product_attention(q, k, v, mask, 0.4, impl=impl, block=block)
  )
  want_fn = lambda q, k, v: jnp.sum(
    cot * attention.reference_attention(q, k, v, attention.attention_mask(segs), 0.4)
  )
  got = jax.jit(jax.value_and_grad(got_fn, argnums=(0, 1, 2)))(q, k, v)
  want = jax.value_and_grad(want_fn, argnums=(0, 1, 2))(q, k, v)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)


def test_blocked_attention_has_no_full_logits_buffer():
  # L = 64 in blocks of 16: no intermediate (forward or backward) holds H * L * L floats.
  b, length, h, d = 1, 64, 2, 8
  x = jnp.ones((b, length, h, d))
  segs = jnp.ones((b, length), jnp.int32)
  loss = lambda q: jnp.sum(attention.blocked_attention(q, x, x, segs, 0.3, block=16))
  hlo = jax.jit(jax.grad(loss)).lower(x).as_text()
  assert f"{length}x{length}x" not in hlo  # e.g. tensor<1x2x64x64xf32>


def test_reference_attention_gradient_is_autodiff_of_the_softmax():
  # Its backward is written by hand; autodiff of the plain formula is the yardstick, with a
  # padding query (no key to attend: uniform softmax, no gradient to q/k) that the cotangent
  # does not zero, two documents, and a second row of one document.
  b, length, h, dk, dv = 2, 9, 3, 6, 4
  segs = jnp.array([[1] * 4 + [2] * 4 + [0], [5] * 9])
  rng = np.random.default_rng(1)
  q, k = (jnp.asarray(rng.standard_normal((b, length, h, dk), dtype=np.float32)) for _ in range(2))
  v = jnp.asarray(rng.standard_normal((b, length, h, dv), dtype=np.float32))
  cot = jnp.asarray(rng.standard_normal((b, length, h, dv), dtype=np.float32))
  mask = attention.attention_mask(segs)

  def plain(q, k, v):
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.4
    probs = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)

  got = jax.jit(
    jax.value_and_grad(
      lambda *a: jnp.sum(cot * attention.reference_attention(*a, mask, 0.4)), argnums=(0, 1, 2)
    )
  )(q, k, v)
  want = jax.value_and_grad(lambda *a: jnp.sum(cot * plain(*a)), argnums=(0, 1, 2))(q, k, v)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)
  assert float(jnp.abs(want[1][1]).max()) > 0.1  # the keys' gradient is not trivially 0


def test_causal_reference_skips_the_upper_triangle_and_equals_the_reference():
  # L = 13 in query blocks of 4 (the last one short).
  segs, q, k, v, cot = _packed_case(2)
  got_fn = lambda q, k, v: jnp.sum(
    cot * attention.causal_reference_attention(q, k, v, segs, 0.4, query_block=4)
  )
  want_fn = lambda q, k, v: jnp.sum(
    cot * attention.reference_attention(q, k, v, attention.attention_mask(segs), 0.4)
  )
  got = jax.jit(jax.value_and_grad(got_fn, argnums=(0, 1, 2)))(q, k, v)
  want = jax.value_and_grad(want_fn, argnums=(0, 1, 2))(q, k, v)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)
  hlo = jax.jit(jax.grad(got_fn)).lower(q, k, v).as_text()
  assert "x13x13xf32" not in hlo and "x4x4xf32" in hlo  # no full logits; the first block's 4 x 4
