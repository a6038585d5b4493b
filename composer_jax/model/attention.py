"""Causal self-attention over packed sequences: MLA (DeepSeek-V2/V3) and plain GQA.

Logits and softmax in float32, masked by segment ids (no cross-document attention,
segment 0 = padding) and token order. The mask comes either dense (`[B, 1, L, L]` bool:
decoding, context parallelism, tests; attended by the plain-jnp `reference`) or as
`SegmentMask(segment_ids)` (training on one device), attended by `cfg.attention_impl`
(`ATTENTION_IMPLS`): `blocked` (flash-style online softmax over key blocks, never builds
`[B, H, L, L]`; CPU), `jax_nn` (`jax.nn.dot_product_attention` with jax's own choice,
which is XLA's reference today), `cudnn` (cuDNN's fused flash attention; GPU) or
`reference` (`causal_reference_attention`: the reference in static query blocks that skip the
causal upper triangle). Given a per-layer `kv_cache` buffer and the token positions, both
modules write the new keys into the cache and attend over it (decoding), returning
`(out, new layer cache)`.

MLA trains in the expanded form (per-head K/V from the latent): its logits cost
`dn + dr` (192 for DeepSeek-V3) multiply-adds per query-key pair and head against
`r + dr` (576) absorbed, so the absorbed form is used only to decode (one query against a
long cached latent, where it saves expanding the cache).
"""

import functools
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from composer_jax.model import kv_cache
from composer_jax.model.config import ModelConfig
from composer_jax.model.layers import Linear, RMSNorm
from composer_jax.model.rope import apply_rope, softmax_scale
from composer_jax.parallel import context

# The reference DeepSeek-V3 code builds q_a/kv_a layernorms with the RMSNorm default eps,
# not config.rms_norm_eps; checkpoints were trained that way.
LATENT_NORM_EPS = 1e-6


def attention_mask(segment_ids: jax.Array, order=None) -> jax.Array:
  """`[B, 1, L, L]` bool: query i may attend key j iff same nonzero segment and j <= i.

  `order [L]` (default `arange(L)`): the sequence index of each row slot, for rows stored
  permuted (context parallelism's zig-zag layout); then j may be attended iff order[j] <= order[i].

  Causality is by token index within the row, which equals position order for packed
  rows (positions increase within a document) and can never leak a later token even if
  positions are not monotonic. Padding queries (segment 0) attend to nothing; their
  outputs are finite (uniform softmax) and must be masked out of the loss.
  """
  length = segment_ids.shape[-1]
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  real = (segment_ids != 0)[:, :, None]
  order = jnp.arange(length) if order is None else jnp.asarray(order)
  causal = order[None, :] <= order[:, None]
  return (same & real & causal)[:, None]


class SegmentMask(NamedTuple):
  """The causal, same-segment mask of `attention_mask(segment_ids)`, not materialized.

  `segment_ids [B, L]` (queries and keys alike; segment 0 = padding).
  """

  segment_ids: jax.Array


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def reference_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float
) -> jax.Array:
  """softmax(scale * q k^T + mask) v per head, materializing `[B, H, L, S]` logits.

  Args:
    q: `[B, L, H, dk]`, k: `[B, S, H, dk]`, v: `[B, S, H, dv]`, mask: `[B, 1, L, S]` bool.
  Returns:
    `[B, L, H, dv]` in `v.dtype`; logits and softmax are float32. Queries with no key
    to attend get a uniform softmax (finite; mask them out of the loss).

  The gradient is written out (`_reference_bwd`) rather than traced through the softmax
  and the mask: it keeps only the probabilities `P` for the backward pass and makes one
  pass over `[B, H, L, S]` for `dS = P * (dP - rowsum(dP * P))` (the softmax Jacobian),
  masked. Autodiff of the same forward saved the masked logits as well and made separate
  passes for the softmax's and the mask's transposes; on XLA:CPU's `tiny` train step
  (`experiments/bench/vs_hf.py`) those passes were most of attention's non-matmul time.
  """
  return _reference_fwd(q, k, v, mask, scale)[0]


def _reference_probs(q, k, mask, scale):
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
  return jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=-1)


def _reference_fwd(q, k, v, mask, scale):
  probs = _reference_probs(q, k, mask, scale)
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v), (q, k, v, mask, probs)


def _reference_bwd(scale, res, g):
  q, k, v, mask, probs = res
  dv = jnp.einsum("bhqk,bqhd->bkhd", probs.astype(g.dtype), g)
  dp = jnp.einsum("bqhd,bkhd->bhqk", g, v, preferred_element_type=jnp.float32)
  ds = probs * (dp - jnp.sum(dp * probs, axis=-1, keepdims=True))
  # A query with no key to attend has a uniform softmax over masked logits: no gradient.
  ds = (jnp.where(mask, ds, 0.0) * scale).astype(q.dtype)
  dq = jnp.einsum("bhqk,bkhd->bqhd", ds, k)
  dk = jnp.einsum("bhqk,bqhd->bkhd", ds, q)
  return dq, dk, dv, np.zeros(mask.shape, jax.dtypes.float0)


reference_attention.defvjp(_reference_fwd, _reference_bwd)


# Query block of `causal_reference_attention`: at L = 128 two blocks skip a quarter of the
# logits; smaller blocks add more small matmuls than they skip on XLA:CPU.
CAUSAL_QUERY_BLOCK = 64


def causal_reference_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  segment_ids: jax.Array,
  scale: float,
  query_block: int = CAUSAL_QUERY_BLOCK,
) -> jax.Array:
  """`reference_attention` under `attention_mask(segment_ids)`, without the causal mask's
  upper triangle of blocks: queries `[i * query_block, (i + 1) * query_block)` attend keys
  `[0, (i + 1) * query_block)`, every key causality lets them see (n static blocks compute
  `(n + 1) / 2n` of the `[L, L]` logits, each exactly as the reference does).

  Shapes as `blocked_attention`. A padding query (no key to attend) gets a uniform softmax
  over its block's keys instead of all L; like the reference's, its output must be masked.
  """
  length = q.shape[1]
  mask = attention_mask(segment_ids)
  out = []
  for start in range(0, length, query_block):
    end = min(start + query_block, length)
    rows = slice(start, end)
    out.append(
      reference_attention(q[:, rows], k[:, :end], v[:, :end], mask[:, :, rows, :end], scale)
    )
  return out[0] if len(out) == 1 else jnp.concatenate(out, axis=1)


def blocked_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, scale: float, block: int
) -> jax.Array:
  """Causal same-segment attention one `block` of queries and keys at a time.

  Flash-attention's online softmax (arXiv 2205.14135, Alg. 1): for each query block, a
  scan over key blocks keeps the running max `m`, normalizer `norm` and output `acc`;
  blocks with no allowed (same segment, causal) pair are skipped. Each query block is
  rematerialized in the backward pass, so no buffer is larger than `[B, H, block, L]`.

  Args:
    q: `[B, L, H, dk]`, k: `[B, L, H, dk]`, v: `[B, L, H, dv]`, segment_ids: `[B, L]`.
  Returns:
    `[B, L, H, dv]` in `v.dtype` (float32 softmax); 0 for queries with no key to attend.
  """
  batch, length, heads, _ = q.shape
  n = -(-length // block)
  pad = n * block - length  # padded tokens get segment 0: they attend and are attended by none
  blocks = lambda a: (
    jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))
    .reshape(batch, n, block, *a.shape[2:])
    .swapaxes(0, 1)
  )  # [n, B, block, ...]
  qb, kb, vb, sb = blocks(q), blocks(k), blocks(v), blocks(segment_ids)
  pos = jnp.arange(n * block).reshape(n, block)

  @jax.checkpoint
  def query_block(qi, si, pi):
    def key_block(carry, j):
      allowed = (
        (si[:, :, None] == sb[j][:, None, :])
        & (si != 0)[:, :, None]
        & (pos[j][None, :] <= pi[:, None])[None]
      )  # [B, block_q, block_k]

      def update(carry):
        m, norm, acc = carry
        s = jnp.einsum("bqhd,bkhd->bhqk", qi, kb[j], preferred_element_type=jnp.float32)
        s = jnp.where(allowed[:, None], s * scale, -jnp.inf)
        # The result does not depend on m (it cancels), so no gradient flows through it.
        m_new = jax.lax.stop_gradient(jnp.maximum(m, s.max(-1)))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(s - m_safe[..., None])
        correction = jnp.exp(m - m_safe)
        pv = jnp.einsum(
          "bhqk,bkhd->bhqd", p.astype(v.dtype), vb[j], preferred_element_type=jnp.float32
        )
        return m_new, norm * correction + p.sum(-1), acc * correction[..., None] + pv

      return jax.lax.cond(allowed.any(), update, lambda c: c, carry), None

    init = (
      jnp.full((batch, heads, block), -jnp.inf),
      jnp.zeros((batch, heads, block)),
      jnp.zeros((batch, heads, block, v.shape[-1])),
    )
    (_, norm, acc), _ = jax.lax.scan(key_block, init, jnp.arange(n))
    return (acc / jnp.where(norm > 0, norm, 1.0)[..., None]).astype(v.dtype).swapaxes(1, 2)

  out = jax.lax.map(lambda a: query_block(*a), (qb, sb, pos))  # [n, B, block, H, dv]
  return out.swapaxes(0, 1).reshape(batch, n * block, heads, -1)[:, :length]


def jax_nn_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, scale: float
) -> jax.Array:
  """`jax.nn.dot_product_attention` with jax's own choice of kernel (XLA's, on every backend).

  It needs one head dim for q, k and v: v is zero-padded to dk and the output cut back.
  Shapes as `blocked_attention`.
  """
  dv = v.shape[-1]
  v = jnp.pad(v, [(0, 0)] * 3 + [(0, q.shape[-1] - dv)])
  out = jax.nn.dot_product_attention(q, k, v, mask=attention_mask(segment_ids), scale=scale)
  return out[..., :dv]


def cudnn_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, scale: float
) -> jax.Array:
  """cuDNN's fused flash attention (GPU only; bf16/fp16, head dims <= 128 and multiples of 8).

  `jax.nn.dot_product_attention` with no `implementation` runs XLA's reference (the full
  `[B, H, L, L]` logits); this asks for cuDNN: the causal mask is its own (`is_causal`) and
  documents are kept apart by the same-segment mask, which cuDNN takes as an additive
  `[B, 1, L, L]` bias. v is zero-padded to dk and the output cut back. Shapes as
  `blocked_attention`.
  """
  dv = v.shape[-1]
  v = jnp.pad(v, [(0, 0)] * 3 + [(0, q.shape[-1] - dv)])
  same = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] > 0)
  out = jax.nn.dot_product_attention(
    q, k, v, mask=same[:, None], scale=scale, is_causal=True, implementation="cudnn"
  )
  return out[..., :dv]


def resolve_attention_impl(name: str, length: int, block: int) -> str:
  """'auto' -> 'jax_nn' on GPU/TPU; on CPU 'blocked' when `length > block`, else
  'reference' (one block; `causal_reference_attention`). Other names as given."""
  if name != "auto":
    return name
  if jax.default_backend() != "cpu":
    return "jax_nn"
  return "blocked" if length > block else "reference"


def dot_product_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  mask: "jax.Array | SegmentMask",
  scale: float,
  impl: str = "auto",
  block: int = 512,
) -> jax.Array:
  """softmax(scale * q k^T + mask) v per head -> `[B, L, H, dv]` in `v.dtype`.

  Args:
    q: `[B, L, H, dk]`, k: `[B, S, H, dk]`, v: `[B, S, H, dv]`.
    mask: `[B, 1, L, S]` bool (always the reference), or `SegmentMask` (L = S), attended by
      `impl` (an `ATTENTION_IMPLS` name or 'auto', `resolve_attention_impl`).
    block: query/key block of `blocked`.
  """
  if not isinstance(mask, SegmentMask):
    return reference_attention(q, k, v, mask, scale)
  impl = resolve_attention_impl(impl, q.shape[1], block)
  if impl == "reference":
    return causal_reference_attention(q, k, v, mask.segment_ids, scale)
  fn = ATTENTION_IMPLS[impl]
  return fn(q, k, v, mask.segment_ids, scale, **({"block": block} if impl == "blocked" else {}))


# Implementations of a `SegmentMask`ed attention by name (`ModelConfig.attention_impl`).
ATTENTION_IMPLS = {
  "blocked": blocked_attention,
  "jax_nn": jax_nn_attention,
  "cudnn": cudnn_attention,
}


def latent_attention(
  q: jax.Array, latent: jax.Array, rank: int, mask: jax.Array, scale: float
) -> jax.Array:
  """Every head attends one shared latent key/value (absorbed MLA decode).

  Args:
    q: `[B, L, H, r + dr]` absorbed queries, latent: `[B, S, r + dr]` cached `[c_kv | k_rope]`
      (the key is the whole row, the value its first `rank` = r entries), mask: `[B, 1, L, S]`.
  Returns:
    `[B, L, H, r]` attention-weighted latents in `latent.dtype`; logits and softmax float32.
  """
  logits = jnp.einsum("blhk,bsk->bhls", q, latent, preferred_element_type=jnp.float32) * scale
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(latent.dtype)
  return jnp.einsum("bhls,bsr->blhr", probs, latent[..., :rank])


class MLA(nn.Module):
  """Multi-head latent attention with decoupled RoPE (arXiv 2405.04434 §2.1, eq. 9-19).

  q = q_b(norm(q_a(x))) (or q(x) without q-LoRA), per head `[nope | rope]`;
  `kv_a(x) = [c_kv | k_rope]`: the kv latent (normalized, expanded per head by kv_b into
  `[k_nope | v]`) and one rope key shared by all heads. `x [B, L, D] -> [B, L, D]`.
  With `cache` (`{'latent': [B, S, r + dr]}`) and `positions [B, L]`: writes `[c_kv | k_rope]`
  at the positions and returns (`[B, L, D]`, updated cache); `mask` is then `[B, 1, L, S]`.
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, cos, sin, mask, cache=None, positions=None):
    c = self.cfg
    h, dn, dr, dv = c.num_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
    lin = dict(init_std=c.initializer_range, dtype=c.dtype, param_dtype=c.param_dtype)
    d = (c.hidden_size,)
    if c.q_lora_rank is None:
      q = Linear(d, (h, dn + dr), ("embed", "heads", "head_dim"), name="q", **lin)(x)
    else:
      q_lat = Linear(d, (c.q_lora_rank,), ("embed", "q_lora"), name="q_a", **lin)(x)
      q_lat = RMSNorm(c.q_lora_rank, LATENT_NORM_EPS, c.param_dtype, name="q_norm")(q_lat)
      q = Linear(
        (c.q_lora_rank,), (h, dn + dr), ("q_lora", "heads", "head_dim"), name="q_b", **lin
      )(q_lat)
    kv = Linear(d, (c.kv_lora_rank + dr,), ("embed", "kv_lora"), name="kv_a", **lin)(x)
    kv_lat, k_rope = kv[..., : c.kv_lora_rank], kv[..., c.kv_lora_rank :]
    kv_lat = RMSNorm(c.kv_lora_rank, LATENT_NORM_EPS, c.param_dtype, name="kv_norm")(kv_lat)
    kv_b = Linear(
      (c.kv_lora_rank,), (h, dn + dv), ("kv_lora", "heads", "head_dim"), name="kv_b", **lin
    )
    o = Linear((h, dv), d, ("heads", "head_dim", "embed"), name="o", **lin)
    q_rope = apply_rope(q[..., dn:], cos, sin)
    k_rope = apply_rope(k_rope[:, :, None, :], cos, sin)
    scale = softmax_scale(dn + dr, c.rope_scaling)
    if cache is not None:
      # Absorbed decode (arXiv 2405.04434 §2.1.2): q_nope . (W_uk c) = (W_uk^T q_nope) . c and
      # softmax(.) (W_uv c) = W_uv (softmax(.) c), so attention runs on the cached latent.
      latent = kv_cache.write(
        cache["latent"], jnp.concatenate([kv_lat, k_rope[:, :, 0]], -1), positions
      )
      w = kv_b.variables["params"]["kernel"].astype(c.dtype)  # [r, H, dn + dv]
      q_lat = jnp.einsum("blhd,rhd->blhr", q[..., :dn], w[..., :dn])
      out = latent_attention(
        jnp.concatenate([q_lat, q_rope], -1), latent, c.kv_lora_rank, mask, scale
      )
      return o(jnp.einsum("blhr,rhd->blhd", out, w[..., dn:])), {"latent": latent}

    def attend(q, latent, mask, expand):
      """`latent [B, S, r + dr]` = `[c_kv | k_rope]` -> per-head K/V (`expand`: kv_b) -> attend."""
      kv = expand(latent[..., : c.kv_lora_rank])
      k_nope, v = kv[..., :dn], kv[..., dn:]
      k_rope = latent[:, :, None, c.kv_lora_rank :]
      k = jnp.concatenate([k_nope, jnp.broadcast_to(k_rope, k_nope.shape[:-1] + (dr,))], axis=-1)
      return dot_product_attention(q, k, v, mask, scale, c.attention_impl, c.attention_block)

    q = jnp.concatenate([q[..., :dn], q_rope], axis=-1)
    latent = jnp.concatenate([kv_lat, k_rope[:, :, 0]], -1)
    if not context.enabled():
      return o(attend(q, latent, mask, kv_b))
    # Context parallel: ranks all-gather the small latent, not K/V, and expand it locally.
    expand = lambda w: lambda x: kv_b.clone(parent=None).apply({"params": {"kernel": w}}, x)
    out = context.attention(
      lambda q, lat, m, w: attend(q, lat, m, expand(w)),
      q,
      latent,
      mask,
      kv_dims=("batch", "seq", None),
      weights=(kv_b.variables["params"]["kernel"],),
      weight_dims=((None, "act_heads", None),),
    )
    return o(out)


class GQA(nn.Module):
  """Grouped-query attention (arXiv 2305.13245) with RoPE on the full head dim (ablations).

  `num_kv_heads` key/value heads, each shared by `num_heads / num_kv_heads` query heads.
  `x [B, L, D] -> [B, L, D]`. With `cache` (`{'k', 'v': [B, S, G, hd]}`) and `positions
  [B, L]`: writes k, v at the positions and returns (`[B, L, D]`, updated cache).
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, cos, sin, mask, cache=None, positions=None):
    c = self.cfg
    h, kvh, hd = c.num_heads, c.num_kv_heads, c.head_dim
    lin = dict(init_std=c.initializer_range, dtype=c.dtype, param_dtype=c.param_dtype)
    d = (c.hidden_size,)
    q = Linear(d, (h, hd), ("embed", "heads", "head_dim"), name="q", **lin)(x)
    k = Linear(d, (kvh, hd), ("embed", "kv_heads", "head_dim"), name="k", **lin)(x)
    v = Linear(d, (kvh, hd), ("embed", "kv_heads", "head_dim"), name="v", **lin)(x)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if cache is not None:
      cache = {
        "k": kv_cache.write(cache["k"], k, positions),
        "v": kv_cache.write(cache["v"], v, positions),
      }
      k, v = cache["k"], cache["v"]

    def attend(q, k, v, mask):
      k, v = jnp.repeat(k, h // kvh, axis=2), jnp.repeat(v, h // kvh, axis=2)
      return dot_product_attention(
        q, k, v, mask, softmax_scale(hd, c.rope_scaling), c.attention_impl, c.attention_block
      )

    if cache is None and context.enabled():  # context parallel: ranks all-gather k|v
      out = context.attention(
        lambda q, kv, m: attend(q, kv[..., :hd], kv[..., hd:], m),
        q,
        jnp.concatenate([k, v], -1),
        mask,
        kv_dims=("batch", "seq", "act_heads", None),
      )
    else:
      out = attend(q, k, v, mask)
    out = Linear((h, hd), d, ("heads", "head_dim", "embed"), name="o", **lin)(out)
    return out if cache is None else (out, cache)
