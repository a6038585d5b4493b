"""HF transformers `DeepseekV3` reference objects built from a `ModelConfig` (tests only)."""

import dataclasses

import numpy as np
import torch
from transformers.models.deepseek_v3 import configuration_deepseek_v3

from composer_jax.model.config import ModelConfig


def hf_config(cfg: ModelConfig) -> configuration_deepseek_v3.DeepseekV3Config:
  """The HF config with the same hyperparameters (eager attention, float32)."""
  rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  if cfg.rope_scaling is not None:
    rope.update(rope_type="yarn", **dataclasses.asdict(cfg.rope_scaling))
  hf = configuration_deepseek_v3.DeepseekV3Config(
    vocab_size=cfg.vocab_size,
    hidden_size=cfg.hidden_size,
    intermediate_size=cfg.intermediate_size,
    moe_intermediate_size=cfg.moe_intermediate_size,
    num_hidden_layers=cfg.num_layers,
    num_attention_heads=cfg.num_heads,
    num_key_value_heads=cfg.num_heads,
    n_shared_experts=cfg.n_shared_experts,
    n_routed_experts=cfg.n_routed_experts,
    routed_scaling_factor=cfg.routed_scaling_factor,
    kv_lora_rank=cfg.kv_lora_rank,
    q_lora_rank=cfg.q_lora_rank,
    qk_rope_head_dim=cfg.qk_rope_head_dim,
    v_head_dim=cfg.v_head_dim,
    qk_nope_head_dim=cfg.qk_nope_head_dim,
    n_group=cfg.n_group,
    topk_group=cfg.topk_group,
    num_experts_per_tok=cfg.num_experts_per_tok,
    first_k_dense_replace=cfg.first_k_dense_replace,
    norm_topk_prob=cfg.norm_topk_prob,
    max_position_embeddings=cfg.max_position_embeddings,
    rms_norm_eps=cfg.rms_norm_eps,
    rope_parameters=rope,
    rope_interleave=True,
  )
  hf._attn_implementation = "eager"
  return hf


def to_torch(x) -> torch.Tensor:
  return torch.from_numpy(np.array(x, dtype=np.float32))
