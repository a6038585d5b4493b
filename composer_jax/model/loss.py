"""Memory-bounded softmax cross-entropy over a large vocabulary.

`chunked_cross_entropy` scans over chunks of `chunk_size` tokens; each chunk's float32
logits `[chunk_size, V]` are recomputed in the backward pass (`jax.checkpoint`), so
neither the forward nor the backward ever holds `[B*L, V]` logits.
"""


import jax
import jax.numpy as jnp

from composer_jax.parallel import context_mesh

# A chunk's rows are flattened `[B, L]` tokens: split like the batch and sequence of the
# hidden states they come from. Pinned inside the checkpointed body, so the residual the
# backward recomputes from keeps that layout (without it, after expert-parallel dispatch
# under tensor parallelism GSPMD gave it the expert view's 8-way token split, which it can
# only bring to the head's `embed` layout by replicating it).
_TOKENS = ("batch", "seq")


def _chunk_sums(carry, chunk, head):
  """Adds one chunk's masked (ce, lse^2, count) sums to `carry`."""
  hidden, targets, mask = chunk  # [C, D], [C], [C]
  hidden = context_mesh.constrain(hidden, (_TOKENS, "act_embed"))
  targets, mask = (context_mesh.constrain(a, (_TOKENS,)) for a in (targets, mask))
  logits = jnp.dot(hidden, head.astype(hidden.dtype), preferred_element_type=jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
  sums = jnp.stack([jnp.sum((lse - target_logit) * mask), jnp.sum(jnp.square(lse) * mask),
                    jnp.sum(mask)])
  return carry + sums, None


def chunked_cross_entropy(hidden: jax.Array, head: jax.Array, targets: jax.Array,
                          mask: jax.Array, *, chunk_size: int = 4096,
                          z_loss_coef: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean next-token cross-entropy (+ optional z-loss) over masked tokens.

  z-loss (PaLM, arXiv 2204.02311 §5): `z_loss_coef * logsumexp(logits)^2`, keeping the
  softmax normalizer near 1.

  Args:
    hidden: `[B, L, D]` final hidden states (after the final norm).
    head: `[D, V]` output projection (`transformer.output_head`).
    targets: `[B, L]` int target token ids.
    mask: `[B, L]` loss weights (1 = count the token, 0 = ignore).
    chunk_size: tokens per chunk; `B*L` is zero-padded up to a multiple of it.
    z_loss_coef: weight of the z-loss term.
  Returns:
    (loss, metrics): loss = ce + z_loss_coef * z_loss, a float32 scalar; metrics:
    'ce' mean cross-entropy, 'z_loss' mean `logsumexp^2` (unweighted), 'num_tokens'
    `sum(mask)`. Means are over `sum(mask)` (1 if the mask is empty).
  """
  if hidden.ndim != 3 or head.ndim != 2 or hidden.shape[-1] != head.shape[0]:
    raise ValueError(f"hidden [B, L, D] and head [D, V] expected, got {hidden.shape} and "
                     f"{head.shape}")
  if targets.shape != hidden.shape[:2] or mask.shape != hidden.shape[:2]:
    raise ValueError(f"targets {targets.shape} and mask {mask.shape} must be [B, L] = "
                     f"{hidden.shape[:2]}")
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
  n = hidden.shape[0] * hidden.shape[1]
  chunk_size = min(chunk_size, n)
  pad = -n % chunk_size
  flat = lambda x: jnp.pad(x.reshape((n,) + x.shape[2:]),
                           [(0, pad)] + [(0, 0)] * (x.ndim - 2))
  chunks = (flat(hidden).reshape(-1, chunk_size, hidden.shape[-1]),
            flat(targets.astype(jnp.int32)).reshape(-1, chunk_size),
            flat(mask.astype(jnp.float32)).reshape(-1, chunk_size))
  body = jax.checkpoint(lambda c, x: _chunk_sums(c, x, head))
  (ce_sum, z_sum, count), _ = jax.lax.scan(body, jnp.zeros(3, jnp.float32), chunks)
  denom = jnp.maximum(count, 1.0)
  ce, z = ce_sum / denom, z_sum / denom
  return ce + z_loss_coef * z, {"ce": ce, "z_loss": z, "num_tokens": count}
