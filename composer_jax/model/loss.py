"""Memory-bounded softmax cross-entropy over a large vocabulary.

`chunked_cross_entropy` maps over blocks of `chunk_size` tokens (`vocab_chunks.map_tokens`);
each block's float32 logits `[chunk_size, V]` come from `vocab_chunks.lse_and_target_logit` (the
same chunked pass the RL losses use, here with the whole vocabulary as one chunk) and are
recomputed in the backward pass, so neither the forward nor the backward ever holds `[B*L, V]`
logits.
"""

import jax
import jax.numpy as jnp

from composer_jax.model import vocab_chunks
from composer_jax.parallel import context_mesh

# A block's rows are flattened `[B, L]` tokens: split like the batch and sequence of the
# hidden states they come from. Pinned inside the block, before the checkpointed logits, so
# the residual the backward recomputes from keeps that layout (without it, after
# expert-parallel dispatch under tensor parallelism GSPMD gave it the expert view's 8-way
# token split, which it can only bring to the head's `embed` layout by replicating it).
_TOKENS = ("batch", "seq")


def _token_terms(hidden, targets, head):
  """Per-token cross-entropy and `lse^2` [C] of one block: hidden [C, D], targets [C]."""
  hidden = context_mesh.constrain(hidden, (_TOKENS, "act_embed"))
  targets = context_mesh.constrain(targets, (_TOKENS,))
  state, target_logit = vocab_chunks.lse_and_target_logit(
    hidden, head.astype(hidden.dtype), targets, head.shape[1]
  )
  lse = state.lse()
  return lse - target_logit, jnp.square(lse)


def chunked_cross_entropy(
  hidden: jax.Array,
  head: jax.Array,
  targets: jax.Array,
  mask: jax.Array,
  *,
  chunk_size: int = 4096,
  z_loss_coef: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
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
    raise ValueError(
      f"hidden [B, L, D] and head [D, V] expected, got {hidden.shape} and {head.shape}"
    )
  if targets.shape != hidden.shape[:2] or mask.shape != hidden.shape[:2]:
    raise ValueError(
      f"targets {targets.shape} and mask {mask.shape} must be [B, L] = {hidden.shape[:2]}"
    )
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
  n = hidden.shape[0] * hidden.shape[1]
  ce, z = vocab_chunks.map_tokens(
    lambda h, y: _token_terms(h, y, head),
    chunk_size,
    hidden.reshape(n, hidden.shape[-1]),
    targets.reshape(n).astype(jnp.int32),
  )
  mask = mask.reshape(n).astype(jnp.float32)
  count = jnp.sum(mask)
  denom = jnp.maximum(count, 1.0)
  ce, z = jnp.sum(ce * mask) / denom, jnp.sum(z * mask) / denom
  return ce + z_loss_coef * z, {"ce": ce, "z_loss": z, "num_tokens": count}
