"""Parity: transformers' DeepseekV3ForCausalLM vs our forward on imported weights.

A tiny float32 HF model exercising every feature (MLA with q-LoRA, YaRN with
mscale != mscale_all_dim, group-limited routing, shared experts, a dense first layer,
norm_topk_prob, routed_scaling_factor, a nonzero random e_score_correction_bias) is
saved with `save_pretrained`, imported with `load_hf`, and our logits (forward +
output_head) must match HF's within 1e-4: on random tokens, and on a packed
two-document row against two separate HF calls.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from composer_jax.hf import importer, writer
from composer_jax.model import transformer

SEQ = 12
DOC_LENS = (5, 7)  # the packed row: two documents filling SEQ tokens


def _hf_config(**kw):
  base = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=12,
    n_routed_experts=8,
    n_shared_experts=2,
    num_experts_per_tok=3,
    n_group=4,
    topk_group=2,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    num_nextn_predict_layers=0,
    tie_word_embeddings=False,
    rope_parameters=dict(
      rope_type="yarn",
      rope_theta=10000.0,
      factor=4.0,
      original_max_position_embeddings=64,
      beta_fast=32.0,
      beta_slow=1.0,
      mscale=1.0,
      mscale_all_dim=0.8,
    ),
  )
  base.update(kw)
  return DeepseekV3Config(**base)


def _random_model(config, seed=0):
  torch.manual_seed(seed)
  model = DeepseekV3ForCausalLM(config).float().eval()
  model.config._attn_implementation = "eager"
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight") or "layernorm" in name:
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      else:  # large enough that router scores and attention are far from uniform
        p.copy_(0.2 * torch.randn_like(p))
    for layer in model.model.layers[config.first_k_dense_replace :]:
      bias = layer.mlp.gate.e_score_correction_bias
      bias.copy_(0.1 * torch.randn_like(bias))
  return model


def _hf_logits(model, tokens):
  with torch.no_grad():
    return model(torch.as_tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  hf = _random_model(_hf_config())
  path = tmp_path_factory.mktemp("hf")
  hf.save_pretrained(path)
  cfg, variables = importer.load_hf(str(path))
  return hf, cfg, variables


def test_imported_tree_matches_model_init(models):
  _, cfg, variables = models
  want = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  chex.assert_trees_all_equal_shapes_and_dtypes(variables, want)


def test_bias_and_groups_change_the_output(models):
  """The test model is not degenerate: the bias and the group limit change HF's routing."""
  hf, _, _ = models
  tokens = np.random.default_rng(1).integers(0, 96, (2, SEQ))
  ref = _hf_logits(hf, tokens)
  no_bias = _random_model(_hf_config())
  for layer in no_bias.model.layers[1:]:
    layer.mlp.gate.e_score_correction_bias.zero_()
  no_groups = _random_model(_hf_config(topk_group=4))
  assert np.abs(_hf_logits(no_bias, tokens) - ref).max() > 1e-2
  assert np.abs(_hf_logits(no_groups, tokens) - ref).max() > 1e-2


def test_logits_match_hf(models):
  hf, cfg, variables = models
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, cfg.vocab_size, (3, SEQ)).astype(np.int32)
  # Rows 0-1: one document each; row 2: two packed documents.
  segment_ids = np.ones((3, SEQ), np.int32)
  positions = np.tile(np.arange(SEQ, dtype=np.int32), (3, 1))
  segment_ids[2] = np.repeat([1, 2], DOC_LENS)
  positions[2] = np.concatenate([np.arange(n) for n in DOC_LENS])

  @jax.jit
  def logits_fn(variables, tokens, segment_ids, positions):
    hidden, _ = transformer.forward(cfg, variables, tokens, segment_ids, positions)
    return hidden @ transformer.output_head(cfg, variables["params"])

  ours = np.asarray(
    logits_fn(variables, jnp.asarray(tokens), jnp.asarray(segment_ids), jnp.asarray(positions))
  )
  chex.assert_trees_all_close(ours[:2], _hf_logits(hf, tokens[:2]), atol=1e-4, rtol=1e-4)
  split = DOC_LENS[0]
  packed = np.concatenate(
    [_hf_logits(hf, tokens[2:, :split]), _hf_logits(hf, tokens[2:, split:])], axis=1
  )
  chex.assert_trees_all_close(ours[2:], packed, atol=1e-4, rtol=1e-4)


def test_export_serves_in_transformers(models, tmp_path):
  """Our export of the imported weights, loaded by transformers, gives HF's logits."""
  hf, cfg, variables = models
  writer.export_hf(cfg, lambda p: writer.leaf(variables, p), str(tmp_path), dtype="float32")
  served = DeepseekV3ForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager")
  tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, (2, SEQ))
  chex.assert_trees_all_close(
    _hf_logits(served.float().eval(), tokens), _hf_logits(hf, tokens), atol=1e-5, rtol=1e-5
  )


def test_half_split_rope_layout(models, tmp_path):
  """A `rope_interleave: false` checkpoint (rope dims half-split) imports to the same tree."""
  hf, cfg, variables = models
  config = _hf_config(rope_interleave=False)
  half = DeepseekV3ForCausalLM(config).float().eval()
  half.config._attn_implementation = "eager"
  dn, dr, h = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.num_heads
  to_half = np.concatenate([np.arange(0, dr, 2), np.arange(1, dr, 2)])  # evens, then odds
  q_rows = np.concatenate(
    [hd * (dn + dr) + np.concatenate([np.arange(dn), dn + to_half]) for hd in range(h)]
  )
  kv_rows = np.concatenate([np.arange(cfg.kv_lora_rank), cfg.kv_lora_rank + to_half])
  state = {k: v.clone() for k, v in hf.state_dict().items()}
  for k in state:
    if k.endswith("q_b_proj.weight"):
      state[k] = state[k][q_rows]
    elif k.endswith("kv_a_proj_with_mqa.weight"):
      state[k] = state[k][kv_rows]
  half.load_state_dict(state)
  tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, (1, SEQ))
  chex.assert_trees_all_close(
    _hf_logits(half, tokens), _hf_logits(hf, tokens), atol=1e-5, rtol=1e-5
  )
  half.save_pretrained(tmp_path)
  chex.assert_trees_all_equal(importer.load_hf(str(tmp_path))[1], variables)
