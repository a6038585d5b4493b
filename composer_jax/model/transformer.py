"""The DeepSeek-V3 / Kimi-K2 decoder as pure functions over a flax.linen module.

`x = embed(tokens)`; `first_k_dense_replace` dense blocks, then MoE blocks, each
pre-norm `x += attn(norm(x)); x += ffn(norm(x))`; a final RMSNorm. Each kind of block
is one `nn.scan` stack (params and the 'router' collection get a leading 'layers'
axis), so compile time does not grow with depth. The output head is not applied here:
`output_head` returns the `[D, V]` matrix for `loss.chunked_cross_entropy`.

Decoding (`decode`) runs the same modules with a `kv_cache` and explicit positions.

Public API: `Transformer`, `init`, `forward`, `decode`, `output_head`, `logical_axes`,
`shapes`, `param_counts`.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from composer_jax.model import kv_cache
from composer_jax.model.attention import GQA, MLA, SegmentMask, attention_mask
from composer_jax.model.config import ModelConfig
from composer_jax.model.layers import Embed, RMSNorm, SwiGLU, param_init
from composer_jax.model.moe import MoE
from composer_jax.model.rope import rope_tables
from composer_jax.parallel import context

_REMAT_POLICIES = {
  "full": jax.checkpoint_policies.nothing_saveable,
  "dots": jax.checkpoint_policies.checkpoint_dots,
  "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


class Block(nn.Module):
  """Pre-norm decoder block: `x [B, L, D] -> (x [B, L, D], (MoE stats or None, cache))`.

  `cache` (this layer's `kv_cache` buffers) and `positions [B, L]` switch attention to
  decoding; the returned cache is the updated one (None without a cache).
  """

  cfg: ModelConfig
  moe: bool

  @nn.compact
  def __call__(self, x, cos, sin, mask, valid, cache=None, positions=None):
    c = self.cfg
    attn = (MLA if c.attention == "mla" else GQA)(c, name="attn")
    y = attn(
      RMSNorm(c.hidden_size, c.rms_norm_eps, c.param_dtype, name="attn_norm")(x),
      cos,
      sin,
      mask,
      cache,
      positions,
    )
    if cache is not None:
      y, cache = y
    x = x + y
    h = RMSNorm(c.hidden_size, c.rms_norm_eps, c.param_dtype, name="mlp_norm")(x)
    if self.moe:
      y, stats = MoE(c, name="moe")(h, valid)
    else:
      y = SwiGLU(
        c.hidden_size, c.intermediate_size, c.initializer_range, c.dtype, c.param_dtype, name="mlp"
      )(h)
      stats = None
    return (x + y).astype(c.dtype), (stats, cache)


def _stack(cfg: ModelConfig, moe: bool, length: int, name: str) -> nn.Module:
  """`length` Blocks as one scanned (optionally rematerialized) module.

  `cfg.scan_layers=False` unrolls the scan fully: the same parameters (leading 'layers' axis),
  one straight-line program.
  """
  block = Block
  if cfg.remat_policy != "none":
    # prevent_cse=False is safe (and faster) inside scan.
    block = nn.remat(Block, policy=_REMAT_POLICIES[cfg.remat_policy], prevent_cse=False)
  # The layer cache is scanned (one slice per layer); everything else is shared. A stack of
  # one layer is never a loop (`unroll=0`: jax unrolls the whole scan): a one-trip `while`
  # still stacks every residual into `[1, ...]` buffers (zero-filled, written, read back).
  unroll = 1 if cfg.scan_layers and length > 1 else 0
  scanned = nn.scan(
    block,
    variable_axes={"params": 0, "router": 0},
    split_rngs={"params": True},
    in_axes=(nn.broadcast,) * 4 + (0, nn.broadcast),
    length=length,
    unroll=unroll,
    metadata_params={nn.PARTITION_NAME: "layers"},
  )
  return scanned(cfg, moe, name=name)


class Head(nn.Module):
  """Holds the untied output head `kernel [D, V] (embed, vocab)`; returns it."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self):
    c = self.cfg
    return self.param(
      "kernel",
      param_init(c.initializer_range, ("embed", "vocab")),
      (c.hidden_size, c.vocab_size),
      c.param_dtype,
    )


class Transformer(nn.Module):
  """`tokens [B, L]` (+ segment_ids, positions `[B, L]`) -> (hidden `[B, L, D]`, aux).

  With a `kv_cache` (and explicit positions): -> (hidden `[B, L, D]`, updated cache).
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens, segment_ids=None, positions=None, cache=None):
    c = self.cfg
    if cache is not None and positions is None:
      raise ValueError("decoding with a kv cache needs explicit positions [batch, seq]")
    segment_ids, positions = _check_inputs(tokens, segment_ids, positions)
    x = Embed(
      c.vocab_size, c.hidden_size, c.initializer_range, c.dtype, c.param_dtype, name="embed"
    )(tokens)
    rope_dim = c.qk_rope_head_dim if c.attention == "mla" else c.head_dim
    cos, sin = rope_tables(positions, rope_dim, c.rope_theta, c.rope_scaling)
    valid, new_cache = segment_ids != 0, {}
    if cache is None and context.enabled():  # rows in zig-zag order: a dense mask
      mask = attention_mask(segment_ids, context.sequence_order(tokens.shape[1]))
    elif cache is None:  # attention picks its kernel (cfg.attention_impl)
      mask = SegmentMask(segment_ids)
    else:
      mask = kv_cache.mask(positions, jax.tree.leaves(cache)[0].shape[2])
    layer_cache = lambda name: None if cache is None else cache[name]
    if c.first_k_dense_replace:
      x, (_, new_cache["dense_layers"]) = _stack(c, False, c.first_k_dense_replace, "dense_layers")(
        x, cos, sin, mask, valid, layer_cache("dense_layers"), positions
      )
    if c.num_moe_layers:
      x, (stats, new_cache["moe_layers"]) = _stack(c, True, c.num_moe_layers, "moe_layers")(
        x, cos, sin, mask, valid, layer_cache("moe_layers"), positions
      )
    else:
      e = c.n_routed_experts
      stats = dict(
        router_counts=jnp.zeros((0, e)),
        router_entropy=jnp.zeros((0,)),
        load_max_over_mean=jnp.zeros((0,)),
        balance_loss=jnp.zeros((0,)),
        dropped_tokens=jnp.zeros((0,)),
      )
    x = RMSNorm(c.hidden_size, c.rms_norm_eps, c.param_dtype, name="final_norm")(x)
    if not c.tie_word_embeddings:
      Head(c, name="lm_head")()
    if cache is not None:
      return x, new_cache
    aux = dict(
      stats, balance_loss=stats["balance_loss"].sum(), dropped_tokens=stats["dropped_tokens"].sum()
    )
    return x, aux


def _check_inputs(tokens, segment_ids, positions):
  """Validates shapes/dtypes; defaults: one document per row, positions 0..L-1."""
  if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(
      f"tokens must be an integer [batch, seq] array, got {tokens.dtype} {tokens.shape}"
    )
  if segment_ids is None:
    segment_ids = jnp.ones_like(tokens)
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
  for name, a in (("segment_ids", segment_ids), ("positions", positions)):
    if a.shape != tokens.shape:
      raise ValueError(f"{name} shape {a.shape} must equal tokens shape {tokens.shape}")
  return segment_ids, positions


def _dummy_tokens() -> jax.Array:
  return jnp.zeros((1, 1), jnp.int32)


def _boxed_init(cfg: ModelConfig, key: jax.Array) -> dict[str, Any]:
  variables = dict(Transformer(cfg).init(key, _dummy_tokens()))
  return {"params": variables["params"], "router": variables.get("router", {})}


@functools.partial(jax.jit, static_argnums=0)
def _init(cfg: ModelConfig, key: jax.Array) -> dict[str, Any]:
  return nn.meta.unbox(_boxed_init(cfg, key))


def init(cfg: ModelConfig, key: jax.Array) -> dict[str, Any]:
  """Fresh unboxed variables `{'params': P, 'router': R}` (the tree of `shapes(cfg)`, each
  leaf's logical axes in `logical_axes(cfg)`, the names in `model/axes.py`).

  One jitted function for every call (`cfg` static): a second init of the same config and
  key type, e.g. inside the trainer's init program after `abstract_state`, reuses the trace.
  """
  return _init(cfg, key)


@functools.lru_cache(maxsize=16)
def _boxed_shapes(cfg: ModelConfig) -> dict[str, Any]:
  """`_boxed_init`'s tree of `nn.Partitioned(ShapeDtypeStruct, names)`, traced once per cfg."""
  return jax.eval_shape(lambda: _boxed_init(cfg, jax.random.key(0)))


def logical_axes(cfg: ModelConfig) -> dict[str, Any]:
  """Tree like `init(cfg, key)` whose leaves are tuples of logical axis names.

  Built with `jax.eval_shape` (no allocation). Use `is_leaf=lambda x: isinstance(x,
  tuple)` when mapping over it together with the variables.
  """
  return jax.tree.map(
    lambda p: tuple(p.names), _boxed_shapes(cfg), is_leaf=lambda x: isinstance(x, nn.Partitioned)
  )


def shapes(cfg: ModelConfig) -> dict[str, Any]:
  """Tree like `init(cfg, key)` of `jax.ShapeDtypeStruct`s (no allocation; one trace per cfg,
  shared with `logical_axes`)."""
  return nn.meta.unbox(_boxed_shapes(cfg))


def param_counts(cfg: ModelConfig) -> tuple[int, int]:
  """(total, active) trainable parameter counts from shapes only (`jax.eval_shape`).

  Convention: total = every trainable parameter of the main model, input embedding and
  output head both included (no multi-token-prediction module; the non-trainable router
  bias excluded). active = total minus the routed experts a token does NOT use, i.e.
  minus `(E - K) / E` of every routed-expert stack; embedding, head, attention, dense
  FFNs, shared experts, router and norms all count as active. With it DeepSeek-V3 gives
  671.0B / 37.6B (report: 671B / 37B) and Kimi-K2 1.026T / 32.9B (report: 1.04T /
  32.6B); leaving the input embedding out of "active" would give 36.6B / 31.7B.
  """
  params = shapes(cfg)["params"]
  total = sum(x.size for x in jax.tree.leaves(params))
  inactive = 0
  if cfg.num_moe_layers:
    routed = sum(x.size for x in jax.tree.leaves(params["moe_layers"]["moe"]["experts"]))
    e = cfg.n_routed_experts
    inactive = routed // e * (e - cfg.num_experts_per_tok)
  return int(total), int(total - inactive)


def forward(
  cfg: ModelConfig,
  variables: dict[str, Any],
  tokens: jax.Array,
  segment_ids: jax.Array | None = None,
  positions: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Runs the model. Returns (hidden `[B, L, D]` after the final norm, aux).

  aux: 'router_counts' `[Lm, E]` float32 tokens per expert (padding excluded),
  'router_entropy' `[Lm]`, 'load_max_over_mean' `[Lm]` (see `router.router_stats`),
  'balance_loss' scalar (already times `seq_aux_loss_coef`, summed over layers; add it to
  the loss), 'dropped_tokens' scalar (dropped token-expert assignments, all layers;
  nonzero only for bounded buffers: `capacity`, `expert_parallel` with `ep_capacity_factor`).
  """
  return Transformer(cfg).apply(variables, tokens, segment_ids, positions)


def decode(
  cfg: ModelConfig,
  variables: dict[str, Any],
  tokens: jax.Array,
  positions: jax.Array,
  cache: dict[str, Any],
) -> tuple[jax.Array, dict[str, Any]]:
  """Runs `tokens [B, L]` at `positions [B, L]` against a `kv_cache` (prefill or one step).

  Writes the tokens' keys into cache slot = position; each attends the slots `<= ` its own
  position (slots a row has not written yet must never be at or below a query position).
  Returns (hidden `[B, L, D]` after the final norm, updated cache).
  """
  return Transformer(cfg).apply(variables, tokens, None, positions, cache)


def output_head(cfg: ModelConfig, params: dict[str, Any]) -> jax.Array:
  """The `[D, V]` output projection (`embedding.T` when `tie_word_embeddings`)."""
  if cfg.tie_word_embeddings:
    return params["embed"]["embedding"].T
  return params["lm_head"]["kernel"]
