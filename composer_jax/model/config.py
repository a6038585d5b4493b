"""Model hyperparameters for the DeepSeek-V3 / Kimi-K2 family, named presets, and the run
config's `model` section: every field of a preset (`as_config`, `preset_config`), read back by
`model_config`.

`ModelConfig` is a frozen dataclass so it can be a static (hashable) jit argument and
a field of checkpoints. Field names follow the Hugging Face `config.json` keys of
`deepseek_v3` / `kimi_k2` where one exists, so the importer maps them one to one.
"""

from __future__ import annotations

import dataclasses
import math
import typing

import ml_collections
from ml_collections import config_dict

ATTENTION_KINDS = ("mla", "gqa")
MOE_DISPATCH_KINDS = ("dropless", "capacity", "dense", "expert_parallel")
ATTENTION_IMPL_KINDS = ("auto", "reference", "blocked", "jax_nn", "cudnn")  # see model/attention.py
# see model/moe.py GROUPED_MATMULS
GROUPED_MATMUL_KINDS = ("auto", "looped", "ragged_dot", "tiled", "unrolled")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """YaRN rope scaling (arXiv 2309.00071), as in DeepSeek-V3's `rope_scaling`."""

  factor: float = 1.0
  original_max_position_embeddings: int = 4096
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  mscale: float = 1.0
  mscale_all_dim: float = 0.0


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Every hyperparameter of the DeepSeek-V3 / Kimi-K2 architecture.

  Shapes in docstrings use: D=hidden_size, V=vocab_size, H=num_heads,
  E=n_routed_experts, K=num_experts_per_tok.
  """

  vocab_size: int = 512
  hidden_size: int = 64
  intermediate_size: int = 128  # dense SwiGLU FFN of the first k layers
  moe_intermediate_size: int = 32  # per routed / shared expert
  num_layers: int = 3
  first_k_dense_replace: int = 1  # the first k layers are dense, the rest MoE
  num_heads: int = 4
  attention: str = "mla"  # "mla" (DeepSeek) or "gqa" (for ablations)
  # MLA (arXiv 2405.04434 §2.1): q/kv low-rank compression, decoupled RoPE.
  q_lora_rank: int | None = 32  # None: q projected directly from x
  kv_lora_rank: int = 32
  qk_nope_head_dim: int = 16
  qk_rope_head_dim: int = 8
  v_head_dim: int = 16
  # Training attention kernel: "auto" = "jax_nn" on GPU/TPU (XLA's reference: jax picks
  # no fused kernel by itself; "cudnn" asks for cuDNN flash attention), "blocked" on CPU
  # (reference when the sequence fits one block); `attention_block`: its query/key block.
  attention_impl: str = "auto"
  attention_block: int = 512
  # GQA (only when attention == "gqa"); head_dim is used for q, k and v.
  num_kv_heads: int = 2
  head_dim: int = 16
  # MoE (DeepSeek-V3 §2.1.2): sigmoid scores, group-limited top-k, shared experts.
  n_routed_experts: int = 8
  n_shared_experts: int = 1
  num_experts_per_tok: int = 2
  n_group: int = 2
  topk_group: int = 1
  routed_scaling_factor: float = 2.5
  norm_topk_prob: bool = True
  scoring_func: str = "sigmoid"
  topk_method: str = "noaux_tc"
  seq_aux_loss_coef: float = 0.0  # optional sequence-level balance loss (eq. 17-20)
  moe_dispatch: str = "dropless"  # one of MOE_DISPATCH_KINDS (see model/moe.py)
  capacity_factor: float = 1.25
  # Grouped matmul of dropless / expert_parallel: "auto" = "looped" on CPU ("unrolled" in the
  # sampler's token loop, rl/decode.py), "ragged_dot" else.
  moe_grouped_matmul: str = "auto"
  moe_tile_rows: int = 128  # largest row chunk of "looped" / tile of "tiled" (smaller when
  # groups are small)
  # expert_parallel per-peer buffer: None = worst case (nothing drops), f = ceil(f * T_shard
  # * K / EP) assignments (see composer_jax.parallel.expert_parallel).
  ep_capacity_factor: float | None = None
  # Positions and normalization.
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  max_position_embeddings: int = 4096
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  initializer_range: float = 0.02
  # Numerics and memory.
  dtype: str = "float32"  # activations / compute
  param_dtype: str = "float32"
  remat_policy: str = "none"
  # Layer stacks: one `scan` loop per stack (compile time flat in depth, less memory), or
  # the loop fully unrolled (`scan_layers=False`: longer compile, no per-layer loop overhead).
  # Same parameter tree either way.
  scan_layers: bool = True

  def __post_init__(self):
    _validate(self)

  @property
  def num_moe_layers(self) -> int:
    return self.num_layers - self.first_k_dense_replace

  @property
  def qk_head_dim(self) -> int:
    return self.qk_nope_head_dim + self.qk_rope_head_dim

  def replace(self, **kw) -> ModelConfig:
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> ModelConfig:
    d = dict(d)
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
      raise ValueError(
        f"Unknown ModelConfig field(s) {unknown}; valid fields: "
        f"{sorted(f.name for f in dataclasses.fields(cls))}"
      )
    if isinstance(d.get("rope_scaling"), dict):
      d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
    return cls(**d)


def _validate(c: ModelConfig) -> None:
  def bad(msg):
    raise ValueError(f"Invalid ModelConfig: {msg}")

  if c.attention not in ATTENTION_KINDS:
    bad(f"attention={c.attention!r}; valid: {ATTENTION_KINDS}")
  if c.moe_dispatch not in MOE_DISPATCH_KINDS:
    bad(f"moe_dispatch={c.moe_dispatch!r}; valid: {MOE_DISPATCH_KINDS}")
  if c.attention_impl not in ATTENTION_IMPL_KINDS:
    bad(f"attention_impl={c.attention_impl!r}; valid: {ATTENTION_IMPL_KINDS}")
  if c.moe_grouped_matmul not in GROUPED_MATMUL_KINDS:
    bad(f"moe_grouped_matmul={c.moe_grouped_matmul!r}; valid: {GROUPED_MATMUL_KINDS}")
  if c.remat_policy not in REMAT_POLICIES:
    bad(f"remat_policy={c.remat_policy!r}; valid: {REMAT_POLICIES}")
  for name in ("dtype", "param_dtype"):
    if getattr(c, name) not in DTYPES:
      bad(f"{name}={getattr(c, name)!r}; valid: {DTYPES}")
  # inf passes every bound below (an rms_norm_eps of inf zeroes every activation).
  scaling = dataclasses.asdict(c.rope_scaling) if c.rope_scaling is not None else {}
  for name, value in [
    *dataclasses.asdict(c).items(),
    *(("rope_scaling." + k, v) for k, v in scaling.items()),
  ]:
    if isinstance(value, float) and not math.isfinite(value):
      bad(f"{name}={value} must be finite")
  positive = [
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "v_head_dim",
    "moe_intermediate_size",
    "n_routed_experts",
    "max_position_embeddings",
    "rope_theta",
    "rms_norm_eps",
    "capacity_factor",
    "moe_tile_rows",
    "attention_block",
  ]
  if c.first_k_dense_replace:
    positive.append("intermediate_size")
  if c.attention == "gqa":
    positive += ["num_kv_heads", "head_dim"]
  for name in positive:
    if not getattr(c, name) > 0:
      bad(f"{name}={getattr(c, name)} must be > 0")
  for name in ("qk_nope_head_dim", "n_shared_experts", "seq_aux_loss_coef", "initializer_range"):
    if getattr(c, name) < 0:
      bad(f"{name}={getattr(c, name)} must be >= 0")
  if c.ep_capacity_factor is not None and not c.ep_capacity_factor > 0:
    bad(f"ep_capacity_factor={c.ep_capacity_factor} must be None (no drops) or > 0")
  if c.q_lora_rank is not None and c.q_lora_rank <= 0:
    bad(f"q_lora_rank={c.q_lora_rank} must be None (no q compression) or > 0")
  if c.topk_method != "noaux_tc":
    bad(f"topk_method={c.topk_method!r}; only 'noaux_tc' (DeepSeek-V3/Kimi-K2) is supported")
  if c.rope_scaling is not None and not c.rope_scaling.factor >= 1:
    bad(f"rope_scaling.factor={c.rope_scaling.factor} must be >= 1 (YaRN extends context)")
  if c.scoring_func != "sigmoid":
    bad(f"scoring_func={c.scoring_func!r}; only 'sigmoid' (DeepSeek-V3/Kimi-K2) is supported")
  if not 0 <= c.first_k_dense_replace <= c.num_layers:
    bad(
      f"first_k_dense_replace={c.first_k_dense_replace} must be in [0, num_layers={c.num_layers}]"
    )
  if c.num_moe_layers > 0:
    if not 1 <= c.num_experts_per_tok <= c.n_routed_experts:
      bad(
        f"num_experts_per_tok (top_k)={c.num_experts_per_tok} must be in "
        f"[1, n_routed_experts={c.n_routed_experts}]"
      )
    if c.n_group < 1 or c.n_routed_experts % c.n_group:
      bad(f"n_group={c.n_group} must divide n_routed_experts={c.n_routed_experts}")
    if not 1 <= c.topk_group <= c.n_group:
      bad(f"topk_group={c.topk_group} must be in [1, n_group={c.n_group}]")
    per_group = c.n_routed_experts // c.n_group
    if c.n_group > 1 and per_group < 2:
      bad(
        f"n_group={c.n_group} leaves {per_group} expert per group; groups are ranked by "
        "their top-2 scores, so each needs >= 2 experts"
      )
    if c.topk_group * per_group < c.num_experts_per_tok:
      bad(
        f"topk_group={c.topk_group} groups of {per_group} experts hold fewer than "
        f"num_experts_per_tok={c.num_experts_per_tok} experts"
      )
  if c.attention == "gqa" and c.num_heads % c.num_kv_heads:
    bad(f"num_kv_heads={c.num_kv_heads} must divide num_heads={c.num_heads}")
  if c.qk_rope_head_dim % 2 or (c.attention == "gqa" and c.head_dim % 2):
    bad("rotary dims (qk_rope_head_dim, head_dim) must be even")


# ---------------------------------------------------------------------------
# Presets. Real dims from the released config.json files.

_KIMI_K2 = ModelConfig(
  vocab_size=163840,
  hidden_size=7168,
  intermediate_size=18432,
  moe_intermediate_size=2048,
  num_layers=61,
  first_k_dense_replace=1,
  num_heads=64,
  q_lora_rank=1536,
  kv_lora_rank=512,
  qk_nope_head_dim=128,
  qk_rope_head_dim=64,
  v_head_dim=128,
  n_routed_experts=384,
  n_shared_experts=1,
  num_experts_per_tok=8,
  n_group=1,
  topk_group=1,
  routed_scaling_factor=2.827,
  norm_topk_prob=True,
  rope_theta=50000.0,
  rope_scaling=RopeScaling(
    factor=32.0,
    original_max_position_embeddings=4096,
    beta_fast=1.0,
    beta_slow=1.0,
    mscale=1.0,
    mscale_all_dim=1.0,
  ),
  max_position_embeddings=131072,
  rms_norm_eps=1e-6,
  tie_word_embeddings=False,
  dtype="bfloat16",
  param_dtype="float32",
  remat_policy="full",
)

_DEEPSEEK_V3 = _KIMI_K2.replace(
  vocab_size=129280,
  first_k_dense_replace=3,
  num_heads=128,
  n_routed_experts=256,
  n_group=8,
  topk_group=4,
  routed_scaling_factor=2.5,
  rope_theta=10000.0,
  rope_scaling=RopeScaling(
    factor=40.0,
    original_max_position_embeddings=4096,
    beta_fast=32.0,
    beta_slow=1.0,
    mscale=1.0,
    mscale_all_dim=1.0,
  ),
  max_position_embeddings=163840,
)

# Runs a train step on a laptop CPU in seconds; exercises every feature
# (MLA with q-LoRA, YaRN, group-limited routing, shared experts, a dense first layer).
# Unrolled: at 3 layers the loop saves no compile time (the unrolled step compiles faster)
# and its stacked residuals cost the step time (RESULTS.md, 2026-12-05, train step vs HF).
_TINY = ModelConfig(
  scan_layers=False,
  rope_scaling=RopeScaling(
    factor=4.0,
    original_max_position_embeddings=256,
    beta_fast=32.0,
    beta_slow=1.0,
    mscale=1.0,
    mscale_all_dim=1.0,
  ),
  max_position_embeddings=1024,
)

# ~0.6B total / ~0.2B active: one GPU.
_SMALL = ModelConfig(
  vocab_size=32768,
  hidden_size=1024,
  intermediate_size=2816,
  moe_intermediate_size=512,
  num_layers=12,
  first_k_dense_replace=1,
  num_heads=8,
  q_lora_rank=384,
  kv_lora_rank=256,
  qk_nope_head_dim=64,
  qk_rope_head_dim=32,
  v_head_dim=64,
  n_routed_experts=32,
  n_shared_experts=2,
  num_experts_per_tok=4,
  n_group=4,
  topk_group=2,
  routed_scaling_factor=2.5,
  rope_theta=10000.0,
  rope_scaling=RopeScaling(
    factor=4.0,
    original_max_position_embeddings=4096,
    beta_fast=32.0,
    beta_slow=1.0,
    mscale=1.0,
    mscale_all_dim=1.0,
  ),
  max_position_embeddings=16384,
  dtype="bfloat16",
  remat_policy="dots",
)

PRESETS = {"kimi_k2": _KIMI_K2, "deepseek_v3": _DEEPSEEK_V3, "tiny": _TINY, "small": _SMALL}


def get_preset(name: str, **overrides) -> ModelConfig:
  """Returns the named preset with optional field overrides."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; valid presets: {sorted(PRESETS)}")
  return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


def as_config(cfg: ModelConfig) -> ml_collections.ConfigDict:
  """`cfg` as the run config's `model` section: every `ModelConfig` field, so each one is
  overridable from the command line (`--config.model.num_layers=2`). `rope_scaling` is a
  nested section (None when the preset has none); an optional number that is None
  (`q_lora_rank`, `ep_capacity_factor`) is a typed placeholder, so it can be set too."""
  hints = typing.get_type_hints(ModelConfig)
  fields = {}
  for name, value in cfg.to_dict().items():
    numbers = [t for t in typing.get_args(hints[name]) if t in (int, float)]
    if value is None and numbers:
      value = config_dict.placeholder(numbers[0])
    fields[name] = value
  return ml_collections.ConfigDict(fields)


def preset_config(name: str) -> ml_collections.ConfigDict:
  """The `model` section of preset `name` (`as_config(get_preset(name))`): a config file
  picks a preset with `c.model = preset_config('small')`, then changes fields in place."""
  return as_config(get_preset(name))


def default_config() -> ml_collections.ConfigDict:
  """The run config's `model` section: the `tiny` preset, every field (`as_config`)."""
  return preset_config("tiny")


def model_config(section) -> ModelConfig:
  """The `ModelConfig` of a run config's `model` section (`as_config`'s fields; a
  ConfigDict or a dict). Build it once per program and pass it down.

  Raises:
    ValueError: one line naming an unknown field or a bad value.
  """
  fields = section.to_dict() if hasattr(section, "to_dict") else dict(section)
  return ModelConfig.from_dict(fields)
