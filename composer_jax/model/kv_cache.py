"""Decode-time key/value cache: one buffer per attention layer, slot j = the token at position j.

* MLA (arXiv 2405.04434 §2.1.2, eq. 9-10): only the normalized kv latent `c_kv` and the
  rotated shared rope key are kept, `latent [B, S, kv_lora_rank + qk_rope_head_dim]` per
  layer — `r + dr` numbers per token instead of `H * (dn + dr + dv)`. The up-projection
  `kv_b` is absorbed into the query and the output at decode time (`attention.MLA`), so the
  latent is never expanded per head.
* GQA: keys (rope applied) and values per kv head, `k`, `v [B, S, num_kv_heads, head_dim]`.

Layout: slot j of a row holds that row's token at position j, so right-padded prompts of
different lengths share one cache and a query at position p attends slots `0..p` (slots
past p may hold stale values; the mask never reads them). Every buffer carries a leading
`layers` axis per scanned stack: `{'dense_layers': {...}, 'moe_layers': {...}}`, matching
the parameter tree, so `nn.scan` hands each layer its slice.
"""

from typing import Any

import jax
import jax.numpy as jnp

from composer_jax.model.config import ModelConfig


def layer_shapes(cfg: ModelConfig, batch: int, max_len: int) -> dict[str, tuple[int, ...]]:
  """Per-layer buffer shapes: MLA `{'latent': [B, S, r + dr]}`; GQA `{'k', 'v': [B, S, G, hd]}`."""
  if cfg.attention == "mla":
    return {"latent": (batch, max_len, cfg.kv_lora_rank + cfg.qk_rope_head_dim)}
  kv = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)
  return {"k": kv, "v": kv}


def init(cfg: ModelConfig, batch: int, max_len: int) -> dict[str, Any]:
  """Zero cache for `batch` rows of up to `max_len` positions, in the compute dtype.

  Returns `{'dense_layers': {name: [n_dense, *shape]}, 'moe_layers': {name: [n_moe, *shape]}}`
  (a stack is absent when the model has no such layers), shapes from `layer_shapes`.
  """
  if max_len > cfg.max_position_embeddings:
    raise ValueError(
      f"cache max_len={max_len} exceeds max_position_embeddings={cfg.max_position_embeddings}"
    )
  stacks = {"dense_layers": cfg.first_k_dense_replace, "moe_layers": cfg.num_moe_layers}
  return {
    name: {k: jnp.zeros((n,) + s, cfg.dtype) for k, s in layer_shapes(cfg, batch, max_len).items()}
    for name, n in stacks.items()
    if n
  }


def write(buf: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
  """Stores `new [B, L, ...]` into `buf [B, S, ...]` at slots `positions [B, L]` (per row)."""
  rows = jnp.arange(buf.shape[0])[:, None]
  return buf.at[rows, positions].set(new.astype(buf.dtype))


def mask(positions: jax.Array, max_len: int) -> jax.Array:
  """`[B, 1, L, S]` bool: the query at position p (`positions [B, L]`) attends slots `<= p`."""
  return (jnp.arange(max_len) <= positions[..., None])[:, None]
