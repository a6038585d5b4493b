"""DeepSeek-V3 MoE router (arXiv 2412.19437 §2.1.2): sigmoid scores, aux-loss-free bias.

* `route`: top-k selection on `sigmoid(logits) + bias`, limited to the `topk_group`
  expert groups with the largest sum of their top-2 biased scores (`noaux_tc`); gate
  values from the UNBIASED scores, normalized over the top-k (`norm_topk_prob`), times
  `routed_scaling_factor` — exactly HF `DeepseekV3TopkRouter`.
* `router_stats`: per-expert token counts, entropy, max/mean load of one layer.
* `balance_loss`: the complementary sequence-wise balance loss (eq. 17-20).
* `update_router_bias`: the aux-loss-free bias update (§2.1.2), a pure function applied
  outside the optimizer to the `'router'` collection.

All router math is float32.
"""

import jax
import jax.numpy as jnp

from composer_jax.model.config import ModelConfig


def route(
  logits: jax.Array, bias: jax.Array, cfg: ModelConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Selects experts per token.

  Args:
    logits: `[T, E]` float32 router logits.
    bias: `[E]` float32 selection bias (HF `e_score_correction_bias`).
    cfg: model config (top-k, groups, normalization, scaling).
  Returns:
    weights `[T, K]` float32 gate values, experts `[T, K]` int32 indices, and scores
    `[T, E]` float32 unbiased sigmoid scores.
  """
  num_tokens, num_experts = logits.shape
  scores = jax.nn.sigmoid(logits.astype(jnp.float32))
  choice = scores + bias.astype(jnp.float32)
  if cfg.n_group > 1:
    per_group = num_experts // cfg.n_group
    grouped = choice.reshape(num_tokens, cfg.n_group, per_group)
    group_scores = jax.lax.top_k(grouped, 2)[0].sum(-1)  # [T, G]
    _, keep = jax.lax.top_k(group_scores, cfg.topk_group)  # [T, topk_group]
    group_mask = jax.nn.one_hot(keep, cfg.n_group, dtype=jnp.bool_).any(axis=1)  # [T, G]
    expert_mask = jnp.repeat(group_mask, per_group, axis=1)  # [T, E]
    choice = jnp.where(expert_mask, choice, -jnp.inf)
  _, experts = jax.lax.top_k(choice, cfg.num_experts_per_tok)
  weights = jnp.take_along_axis(scores, experts, axis=-1)
  if cfg.norm_topk_prob:
    weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
  return weights * cfg.routed_scaling_factor, experts.astype(jnp.int32), scores


def router_stats(experts: jax.Array, scores: jax.Array, valid: jax.Array) -> dict[str, jax.Array]:
  """Load statistics of one MoE layer over the non-padding tokens.

  Args:
    experts: `[T, K]` selected experts; scores: `[T, E]` unbiased sigmoid scores;
    valid: `[T]` bool, False for padding.
  Returns:
    'router_counts' `[E]` float32 tokens routed to each expert;
    'router_entropy' scalar: entropy (nats, max log E) of the MEAN routing distribution,
      i.e. of the batch average of the per-token normalized scores `s_t / sum_e s_t,e`
      (low = the router prefers few experts overall);
    'load_max_over_mean' scalar: max(counts) / mean(counts) (1 = perfectly balanced).
  """
  num_experts = scores.shape[-1]
  v = valid.astype(jnp.float32)
  counts = (jax.nn.one_hot(experts, num_experts, dtype=jnp.float32).sum(1) * v[:, None]).sum(0)
  probs = scores / scores.sum(-1, keepdims=True)
  mean_probs = (probs * v[:, None]).sum(0) / jnp.maximum(v.sum(), 1.0)
  entropy = -jnp.sum(jnp.where(mean_probs > 0, mean_probs * jnp.log(mean_probs), 0.0))
  max_over_mean = counts.max() / jnp.maximum(counts.mean(), 1e-9)
  stats = dict(router_counts=counts, router_entropy=entropy, load_max_over_mean=max_over_mean)
  return jax.lax.stop_gradient(stats)


def balance_loss(experts: jax.Array, scores: jax.Array, valid: jax.Array, coef: float) -> jax.Array:
  """Sequence-wise balance loss `coef * sum_i f_i P_i` (DeepSeek-V3 eq. 17-20).

  Per row (a packed row counts as one sequence): `f_i = E / (K T) * #{t: i in TopK(t)}`,
  `P_i = 1/T sum_t s_i,t / sum_j s_j,t` over the row's T non-padding tokens; averaged
  over rows with at least one token. Gradients flow through `P` only.

  Args:
    experts: `[B, L, K]`; scores: `[B, L, E]`; valid: `[B, L]` bool.
  """
  num_experts, k = scores.shape[-1], experts.shape[-1]
  v = valid.astype(jnp.float32)
  n = jnp.maximum(v.sum(-1), 1.0)  # [B]
  selected = jax.nn.one_hot(experts, num_experts, dtype=jnp.float32).sum(2) * v[..., None]
  f = num_experts / (k * n[:, None]) * selected.sum(1)  # [B, E]
  probs = scores / scores.sum(-1, keepdims=True)
  p = (probs * v[..., None]).sum(1) / n[:, None]  # [B, E]
  per_row = jnp.sum(jax.lax.stop_gradient(f) * p, axis=-1)
  has_tokens = (v.sum(-1) > 0).astype(jnp.float32)
  return coef * jnp.sum(per_row * has_tokens) / jnp.maximum(has_tokens.sum(), 1.0)


def update_router_bias(bias: jax.Array, counts: jax.Array, rate: float) -> jax.Array:
  """Aux-loss-free balancing: `bias += rate * sign(mean_load - load)` per layer.

  Args:
    bias: `[Lm, E]` selection bias (variables['router']['moe_layers']['moe']['bias']).
    counts: `[Lm, E]` tokens per expert of the step (aux['router_counts']).
    rate: bias update speed gamma (DeepSeek-V3 used 0.001).
  Returns:
    the new `[Lm, E]` bias, in `bias.dtype`.
  """
  if bias.shape != counts.shape:
    raise ValueError(f"bias shape {bias.shape} != counts shape {counts.shape}; both [Lm, E]")
  mean = counts.mean(axis=-1, keepdims=True)
  return (bias + rate * jnp.sign(mean - counts)).astype(bias.dtype)
