"""The compared model of the peer benches, and its transformers twin (no flags: importable by
every bench and by `versus` workers)."""

from __future__ import annotations


def model_config(preset: str, layers: int, device: str):
  """The compared `ModelConfig`: float32 on CPU, bf16 compute on GPU; no remat;
  `layers` > 0 cuts the stack (1 dense + the rest MoE)."""
  from composer_jax.model import config as model_config

  dtype = "float32" if device == "cpu" else "bfloat16"
  cfg = model_config.get_preset(preset).replace(
    dtype=dtype, param_dtype="float32", remat_policy="none"
  )
  if layers:
    cfg = cfg.replace(
      num_layers=layers, first_k_dense_replace=min(cfg.first_k_dense_replace, layers - 1)
    )
  return cfg


def hf_model(cfg, device: str, experts: str = "eager"):
  """transformers' `DeepseekV3ForCausalLM` of `cfg` (`hf.config_map.to_hf`), float32
  parameters, PyTorch SDPA attention, `experts` = its experts implementation."""
  import torch
  from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

  from composer_jax.hf import config_map

  hf_cfg = DeepseekV3Config(**config_map.to_hf(cfg, torch_dtype="float32"))
  hf_cfg._attn_implementation = "sdpa"
  hf_cfg._experts_implementation = experts
  torch.manual_seed(0)
  return DeepseekV3ForCausalLM(hf_cfg).float().to("cuda" if device == "gpu" else "cpu")
