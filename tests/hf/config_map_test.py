"""HF config.json <-> ModelConfig, on the released DeepSeek-V3 / Kimi-K2 / K2.5 configs."""

import copy

import pytest

from composer_jax.hf import config_map
from composer_jax.model.config import get_preset

# Architecture keys of the released config.json files (deepseek-ai/DeepSeek-V3,
# moonshotai/Kimi-K2-Instruct); runtime-only keys (auto_map, token ids, ...) omitted.
DEEPSEEK_V3 = {
  "architectures": ["DeepseekV3ForCausalLM"],
  "model_type": "deepseek_v3",
  "attention_bias": False,
  "first_k_dense_replace": 3,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "initializer_range": 0.02,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 8,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": True,
  "num_attention_heads": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
  },
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn",
  },
  "rope_theta": 10000,
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "tie_word_embeddings": False,
  "topk_group": 4,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "v_head_dim": 128,
  "vocab_size": 129280,
}
KIMI_K2 = dict(
  DEEPSEEK_V3,
  model_type="kimi_k2",
  first_k_dense_replace=1,
  max_position_embeddings=131072,
  n_group=1,
  n_routed_experts=384,
  num_attention_heads=64,
  num_key_value_heads=64,
  num_nextn_predict_layers=0,
  rope_theta=50000.0,
  routed_scaling_factor=2.827,
  topk_group=1,
  vocab_size=163840,
  rope_scaling={
    "beta_fast": 1.0,
    "beta_slow": 1.0,
    "factor": 32.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn",
  },
)
# The presets differ from a plain import only in these run-time choices.
PRESET_RUNTIME = dict(dtype="bfloat16", param_dtype="float32", remat_policy="full")


@pytest.mark.parametrize(
  "raw,preset,mtp", [(DEEPSEEK_V3, "deepseek_v3", 1), (KIMI_K2, "kimi_k2", 0)]
)
def test_released_configs_match_presets(raw, preset, mtp):
  hf = config_map.from_hf(raw, **PRESET_RUNTIME)
  assert hf.model == get_preset(preset)
  assert (hf.prefix, hf.rope_interleave, hf.num_mtp_layers) == ("", True, mtp)


def test_kimi_k25_nested_text_config():
  text = {k: v for k, v in KIMI_K2.items() if k != "quantization_config"}
  raw = {
    "model_type": "kimi_k25",
    "architectures": ["KimiK25ForConditionalGeneration"],
    "text_config": text,
    "vision_config": {"hidden_size": 1152},
    "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized"},
  }
  hf = config_map.from_hf(raw, **PRESET_RUNTIME)
  assert hf.model == get_preset("kimi_k2") and hf.prefix == "language_model."


def test_transformers5_rope_parameters_spelling():
  raw = copy.deepcopy(DEEPSEEK_V3)
  rope = raw.pop("rope_scaling")
  del rope["type"]
  raw["rope_parameters"] = dict(rope, rope_type="yarn", rope_theta=raw.pop("rope_theta"))
  assert config_map.from_hf(raw).model == config_map.from_hf(DEEPSEEK_V3).model


@pytest.mark.parametrize("preset", ["tiny", "deepseek_v3"])
def test_to_hf_from_hf_roundtrip(preset):
  cfg = get_preset(preset, q_lora_rank=None) if preset == "tiny" else get_preset(preset)
  back = config_map.from_hf(
    config_map.to_hf(cfg),
    dtype=cfg.dtype,
    param_dtype=cfg.param_dtype,
    remat_policy=cfg.remat_policy,
    scan_layers=cfg.scan_layers,
  )
  assert back.model == cfg


@pytest.mark.parametrize(
  "change,match",
  [
    (dict(model_type="llama"), r"Unsupported model_type='llama'; supported: \('deepseek_v3'"),
    (dict(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    (dict(num_key_value_heads=8), "num_key_value_heads=8 must equal"),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), "Unsupported rope type 'linear'"),
    (dict(vocab_size=None), r"lacks required key\(s\) \['vocab_size'\]"),
    # A value of the wrong JSON type: one line naming the key and the type it needs.
    (dict(rope_scaling="yarn"), r"rope_scaling='yarn' must be a JSON object or null"),
    (dict(rope_parameters=[1]), r"rope_parameters=\[1\] must be a JSON object or null"),
    (
      dict(rope_scaling={"type": "yarn", "factor": "40"}),
      r"rope_scaling.factor='40' must be a number",
    ),
    (dict(num_hidden_layers="61"), r"num_hidden_layers='61' must be an integer"),
    (dict(vocab_size=1.5), r"vocab_size=1.5 must be an integer"),
    (dict(rope_theta="1e4"), r"rope_theta='1e4' must be a number"),
    (dict(norm_topk_prob=1), r"norm_topk_prob=1 must be true or false"),
    (dict(rope_interleave="false"), r"rope_interleave='false' must be true or false"),
    (dict(q_lora_rank=True), r"q_lora_rank=True must be an integer or null"),
    (dict(text_config="kimi"), r"text_config='kimi' must be a JSON object"),
  ],
)
def test_bad_configs(change, match):
  raw = {k: v for k, v in dict(DEEPSEEK_V3, **change).items() if v is not None}
  with pytest.raises(ValueError, match=match):
    config_map.from_hf(raw)


def test_bad_nested_model_type():
  with pytest.raises(ValueError, match="text_config.model_type='qwen3'"):
    config_map.from_hf({"model_type": "kimi_k25", "text_config": dict(KIMI_K2, model_type="qwen3")})


_JSON_VALUES = [None, True, 0, -1, 1.5, float("nan"), "x", [], [1], {}, {"type": "yarn"}]


def test_any_json_value_anywhere_is_accepted_or_one_value_error():
  """Every key the mapping reads (top level and rope_scaling), set to a value of every JSON
  type: from_hf returns or raises ValueError (never TypeError/AttributeError from deep in)."""
  keys = [*DEEPSEEK_V3, "text_config", "rope_parameters", "rope_interleave", "num_mtp_layers"]
  cases = [({k: v}, None) for k in keys for v in _JSON_VALUES]
  cases += [({}, {k: v}) for k in [*DEEPSEEK_V3["rope_scaling"]] for v in _JSON_VALUES]
  for top, rope in cases:
    raw = copy.deepcopy(DEEPSEEK_V3)
    raw.update(top)
    if rope:
      raw["rope_scaling"].update(rope)
    try:
      config_map.from_hf(raw)
    except ValueError as e:
      assert "\n" not in str(e)
  with pytest.raises(ValueError, match=r"lacks required key\(s\) \['num_hidden_layers'\]"):
    config_map.from_hf(dict(DEEPSEEK_V3, num_hidden_layers=None))
