"""The Muon benches' `wide` model and learning rate (no flags: importable by `muon` and by
`vs_torch_muon`'s workers)."""

from __future__ import annotations

LR = 0.02


def wide():
  """`tiny` with every matrix 4x wider and twice the experts: Newton–Schulz dominates the step."""
  from composer_jax.model import config as model_config

  return model_config.get_preset(
    "tiny",
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=128,
    q_lora_rank=128,
    kv_lora_rank=128,
    n_routed_experts=16,
    n_group=4,
    topk_group=2,
    num_layers=4,
  )
