"""ModelConfig validation, preset parameter counts, and the run config's `model` section."""

import dataclasses
import math

import jax
import pytest

from composer_jax.hf import names, quant, writer
from composer_jax.model import config as model_config
from composer_jax.model import transformer
from composer_jax.model.config import PRESETS, ModelConfig, RopeScaling, get_preset

KEY = jax.random.key(0)


def _hand_counts(c: ModelConfig):
  """(total, active) by hand from the architecture (MLA with q-LoRA, untied head)."""
  h, d = c.num_heads, c.hidden_size
  attn = (
    d * c.q_lora_rank
    + c.q_lora_rank
    + c.q_lora_rank * h * c.qk_head_dim
    + d * (c.kv_lora_rank + c.qk_rope_head_dim)
    + c.kv_lora_rank
    + c.kv_lora_rank * h * (c.qk_nope_head_dim + c.v_head_dim)
    + h * c.v_head_dim * d
  )
  block = attn + 2 * d  # + the two norms
  expert = 3 * d * c.moe_intermediate_size
  moe = (c.n_routed_experts + c.n_shared_experts) * expert + d * c.n_routed_experts
  total = (
    2 * c.vocab_size * d
    + d
    + c.num_layers * block
    + c.first_k_dense_replace * 3 * d * c.intermediate_size
    + c.num_moe_layers * moe
  )
  active = total - c.num_moe_layers * (c.n_routed_experts - c.num_experts_per_tok) * expert
  return total, active


@pytest.mark.parametrize("name", ["kimi_k2", "deepseek_v3", "small", "tiny"])
def test_param_counts_match_hand_count(name):
  cfg = get_preset(name)
  assert transformer.param_counts(cfg) == _hand_counts(cfg)


@pytest.mark.parametrize(
  "name,total,active,tol",
  [
    # DeepSeek-V3 report: 671B total, 37B activated (we get 671.0B / 37.6B).
    ("deepseek_v3", 671e9, 37e9, 0.016),
    # Kimi K2 report: 1.04T total, 32.6B activated (we get 1.026T / 32.9B).
    ("kimi_k2", 1.04e12, 32.6e9, 0.014),
  ],
)
def test_param_counts_near_public_numbers(name, total, active, tol):
  got_total, got_active = transformer.param_counts(get_preset(name))
  assert got_total == pytest.approx(total, rel=tol)
  assert got_active == pytest.approx(active, rel=tol)


def test_kimi_k2_count_matches_the_released_checkpoint():
  """Hugging Face counts 1026.5B elements in moonshotai/Kimi-K2-Instruct's safetensors (block
  fp8 weights + their float32 `weight_scale_inv`); the "1.04T" of Kimi's report is not what
  the released weights hold. Counted here from our HF tensor list, independent of
  `param_counts`, which must agree on the weights alone."""
  cfg = get_preset("kimi_k2")
  entries = names.entries(cfg)
  weights = sum(math.prod(e.hf_shape) for e in entries)
  bo, bi = quant.FP8_BLOCK
  scales = sum(
    math.ceil(e.hf_shape[0] / bo) * math.ceil(e.hf_shape[1] / bi)
    for e in entries
    if writer.fp8_quantized(e)
  )
  assert weights == transformer.param_counts(cfg)[0] + cfg.num_moe_layers * cfg.n_routed_experts
  assert round((weights + scales) / 1e8) == 10265


@pytest.mark.parametrize(
  "overrides,match",
  [
    (dict(num_experts_per_tok=9), "num_experts_per_tok"),
    (dict(n_group=3), "n_group=3 must divide"),
    (dict(n_group=8, topk_group=4), "2 experts"),
    (dict(topk_group=3), "topk_group"),
    (dict(n_group=4, topk_group=1, num_experts_per_tok=3), "fewer than"),
    (dict(attention="mha"), "attention"),
    (dict(moe_dispatch="megablox"), "moe_dispatch"),
    (dict(remat_policy="some"), "remat_policy"),
    (dict(dtype="int8"), "dtype"),
    (dict(hidden_size=0), "hidden_size"),
    (dict(q_lora_rank=0), "q_lora_rank"),
    (dict(capacity_factor=0.0), "capacity_factor"),
    (dict(qk_rope_head_dim=7), "even"),
    (dict(first_k_dense_replace=4), "first_k_dense_replace"),
    (dict(rope_scaling=RopeScaling(factor=0.5)), "factor"),
    (dict(scoring_func="softmax"), "sigmoid"),
    (dict(rms_norm_eps=float("inf")), r"rms_norm_eps=inf must be finite"),
    (
      dict(rope_scaling=RopeScaling(factor=4.0, mscale=float("nan"))),
      r"rope_scaling.mscale=nan must be finite",
    ),
  ],
)
def test_bad_config_raises(overrides, match):
  with pytest.raises(ValueError, match=match):
    get_preset("tiny", **overrides)


def test_unknown_preset_and_field():
  with pytest.raises(ValueError, match="Unknown model preset"):
    get_preset("gpt5")
  with pytest.raises(ValueError, match="Unknown ModelConfig field"):
    ModelConfig.from_dict({"hidden": 3})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_field_round_trips_through_the_run_config(name):
  """`preset_config` holds every `ModelConfig` field (nested rope_scaling included), and
  `model_config` builds the preset back from it, equal field for field."""
  section = model_config.preset_config(name)
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  assert set(section.keys()) == fields
  assert model_config.model_config(section) == get_preset(name)
  assert model_config.model_config(section.to_dict()) == get_preset(name)


def test_a_field_override_changes_the_built_model():
  """A field set on the section (what `--config.model.hidden_size=32` does) reaches the
  parameter shapes; an optional field that is None takes a value of its type."""
  section = model_config.default_config()
  before = jax.eval_shape(lambda: transformer.init(model_config.model_config(section), KEY))
  section.hidden_size = 32
  section.ep_capacity_factor = 2.0  # a placeholder(float) in the preset: None
  cfg = model_config.model_config(section)
  after = jax.eval_shape(lambda: transformer.init(cfg, KEY))
  assert cfg.ep_capacity_factor == 2.0
  assert before["params"]["embed"]["embedding"].shape[-1] == 64
  assert after["params"]["embed"]["embedding"].shape[-1] == 32


def test_unknown_field_is_one_line():
  section = model_config.default_config().to_dict()
  with pytest.raises(ValueError, match=r"Unknown ModelConfig field\(s\) \['num_layerz'\]"):
    model_config.model_config({**section, "num_layerz": 2})
