"""Hugging Face `config.json` <-> `ModelConfig` for `deepseek_v3` and `kimi_k2` models.

Accepts both rope spellings (`rope_theta` + `rope_scaling: {"type": "yarn", ...}` of
the released checkpoints, and transformers 5.x `rope_parameters: {"rope_type", "rope_theta",
...}`) and multimodal wrappers that nest the text model under `text_config` (Kimi K2.5:
`model_type: kimi_k25`, text tensors prefixed `language_model.`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from composer_jax.model.config import ModelConfig, RopeScaling

MODEL_TYPES = ("deepseek_v3", "kimi_k2")
NESTED_PREFIX = "language_model."  # tensor-name prefix of a text model nested under text_config

# HF key -> ModelConfig field, copied verbatim when present.
_SAME = (
  "vocab_size",
  "hidden_size",
  "intermediate_size",
  "moe_intermediate_size",
  "first_k_dense_replace",
  "q_lora_rank",
  "kv_lora_rank",
  "qk_nope_head_dim",
  "qk_rope_head_dim",
  "v_head_dim",
  "n_routed_experts",
  "n_shared_experts",
  "num_experts_per_tok",
  "routed_scaling_factor",
  "norm_topk_prob",
  "scoring_func",
  "topk_method",
  "max_position_embeddings",
  "rms_norm_eps",
  "tie_word_embeddings",
  "initializer_range",
)
_RENAMED = {"num_hidden_layers": "num_layers", "num_attention_heads": "num_heads"}
_REQUIRED = (
  "vocab_size",
  "hidden_size",
  "intermediate_size",
  "moe_intermediate_size",
  "num_hidden_layers",
  "num_attention_heads",
  "kv_lora_rank",
  "qk_nope_head_dim",
  "qk_rope_head_dim",
  "v_head_dim",
  "n_routed_experts",
  "num_experts_per_tok",
)
# Keys whose value must be this for our architecture to be the same function.
_FIXED = {"hidden_act": "silu", "attention_bias": False, "moe_layer_freq": 1}
_YARN_KEYS = tuple(f.name for f in dataclasses.fields(RopeScaling))
_MODEL_TYPES = typing.get_type_hints(ModelConfig)
_YARN_TYPES = typing.get_type_hints(RopeScaling)
_TYPE_WORDS = {
  int: "an integer",
  float: "a number",
  bool: "true or false",
  str: "a string",
  dict: "a JSON object",
}


def _typed(c: dict[str, Any], key: str, kind, where: str = "") -> Any:
  """`c[key]` (None when absent) if it is a JSON value of type `kind` (a ModelConfig field's
  type; a number may be an integer, an integer field takes an integral number), else a
  one-line ValueError naming the key and the type it needs."""
  value = c.get(key)
  kinds = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
  if value is None:
    return None
  for k in kinds:
    if k is bool and isinstance(value, bool):
      return value
    if isinstance(value, bool):
      continue
    if k is float and isinstance(value, (int, float)):
      return float(value)
    if k is int and (isinstance(value, int) or isinstance(value, float) and value.is_integer()):
      return int(value)
    if k in (str, dict) and isinstance(value, k):
      return value
  need = " or ".join(_TYPE_WORDS[k] for k in kinds if k in _TYPE_WORDS)
  shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
  raise ValueError(
    f"config.json {where}{key}={shown} must be {need}{' or null' if type(None) in kinds else ''}"
  )


@dataclasses.dataclass(frozen=True)
class HFConfig:
  """A parsed HF config: our ModelConfig plus the facts the tensor mapping needs."""

  model: ModelConfig
  prefix: str  # tensor-name prefix of the text model ("" or "language_model.")
  rope_interleave: bool  # HF weights hold rope dims as interleaved pairs (DeepSeek layout)
  num_mtp_layers: int  # MTP layers stored after the main stack (skipped on import)


def text_config(raw: dict[str, Any]) -> tuple[dict[str, Any], str]:
  """(text-model config dict, tensor-name prefix); unwraps `text_config` if present."""
  if "text_config" not in raw:
    return raw, ""
  text = dict(_typed(raw, "text_config", dict) or {})
  for key in ("quantization_config", "tie_word_embeddings"):
    if key in raw and key not in text:
      text[key] = raw[key]
  return text, NESTED_PREFIX


def _rope(c: dict[str, Any], where: str) -> tuple[float, RopeScaling | None]:
  params = _typed(c, "rope_parameters", dict | None, where) or {}
  legacy = _typed(c, "rope_scaling", dict | None, where) or {}
  theta = _typed(c, "rope_theta", float, where)
  if theta is None:
    theta = _typed(params, "rope_theta", float, f"{where}rope_parameters.")
  theta = 10000.0 if theta is None else theta
  rope_type = _typed(params, "rope_type", str, f"{where}rope_parameters.")
  scaling, field = (
    (params, "rope_parameters") if rope_type not in (None, "default") else (legacy, "rope_scaling")
  )
  at = f"{where}{field}."
  kind = _typed(scaling, "rope_type", str, at) or _typed(scaling, "type", str, at) or "default"
  if kind == "default":
    return theta, None
  if kind != "yarn":
    raise ValueError(f"Unsupported rope type {kind!r}; supported: 'default', 'yarn'")
  if scaling.get("attention_factor") is not None:
    raise ValueError(
      "rope attention_factor is not supported; DeepSeek YaRN derives it from "
      "mscale / mscale_all_dim"
    )
  return theta, RopeScaling(
    **{k: _typed(scaling, k, _YARN_TYPES[k], at) for k in _YARN_KEYS if scaling.get(k) is not None}
  )


def from_hf(raw: dict[str, Any], **overrides) -> HFConfig:
  """Parses a `config.json` dict; `overrides` set ModelConfig fields (dtype, remat, ...)."""
  c, prefix = text_config(raw)
  where = "text_config." if prefix else ""
  model_type = c.get("model_type")
  if model_type not in MODEL_TYPES:
    raise ValueError(f"Unsupported {where}model_type={model_type!r}; supported: {MODEL_TYPES}")
  missing = [k for k in _REQUIRED if c.get(k) is None]
  if missing:
    raise ValueError(f"config.json ({model_type}) lacks required key(s) {missing}")
  for key, want in _FIXED.items():
    if c.get(key, want) != want:
      raise ValueError(f"config.json {key}={c[key]!r} is not supported; only {want!r}")
  # Every value read is checked against its field's type first: one line naming the key.
  fields = {k: _typed(c, k, _MODEL_TYPES[k], where) for k in _SAME}
  fields = {k: v for k, v in fields.items() if v is not None}
  fields.update({ours: _typed(c, k, _MODEL_TYPES[ours], where) for k, ours in _RENAMED.items()})
  kv_heads = _typed(c, "num_key_value_heads", int | None, where)
  if (kv_heads or fields["num_heads"]) != fields["num_heads"]:
    raise ValueError(
      f"num_key_value_heads={kv_heads} must equal num_attention_heads={fields['num_heads']} for MLA"
    )
  fields["n_group"] = _typed(c, "n_group", int | None, where) or 1
  fields["topk_group"] = _typed(c, "topk_group", int | None, where) or 1
  fields.setdefault("first_k_dense_replace", 0)
  fields.setdefault("n_shared_experts", 0)
  fields["q_lora_rank"] = _typed(c, "q_lora_rank", _MODEL_TYPES["q_lora_rank"], where)
  fields["rope_theta"], fields["rope_scaling"] = _rope(c, where)
  fields["attention"] = "mla"
  fields.update(overrides)
  mtp = (
    _typed(c, "num_nextn_predict_layers", int | None, where)
    or _typed(c, "num_mtp_layers", int | None, where)
    or 0
  )
  interleave = _typed(c, "rope_interleave", bool, where)
  return HFConfig(ModelConfig(**fields), prefix, True if interleave is None else interleave, mtp)


def to_hf(
  cfg: ModelConfig, *, quantization_config: dict | None = None, torch_dtype: str = "bfloat16"
) -> dict[str, Any]:
  """A `deepseek_v3` config.json for `cfg`, loadable by transformers and vLLM/SGLang.

  Writes both rope spellings (legacy `rope_scaling` + `rope_theta`, and transformers 5.x
  `rope_parameters`) and `num_nextn_predict_layers: 0` (no MTP weights are exported).
  """
  if cfg.attention != "mla":
    raise ValueError(f"Only MLA models export to deepseek_v3, got attention={cfg.attention!r}")
  out: dict[str, Any] = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
  out.update({k: getattr(cfg, k) for k in _SAME})
  out.update({k: getattr(cfg, ours) for k, ours in _RENAMED.items()})
  out.update(_FIXED)
  out.update(
    num_key_value_heads=cfg.num_heads,
    n_group=cfg.n_group,
    topk_group=cfg.topk_group,
    q_lora_rank=cfg.q_lora_rank,
    rope_theta=cfg.rope_theta,
    rope_interleave=True,
    num_nextn_predict_layers=0,
    torch_dtype=torch_dtype,
    dtype=torch_dtype,
  )
  rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  if cfg.rope_scaling is not None:
    yarn = dataclasses.asdict(cfg.rope_scaling)
    out["rope_scaling"] = {"type": "yarn", "rope_type": "yarn", **yarn}
    rope = {"rope_type": "yarn", "rope_theta": cfg.rope_theta, **yarn}
  out["rope_parameters"] = rope
  if quantization_config is not None:
    out["quantization_config"] = quantization_config
  return out
