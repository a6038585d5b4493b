"""The jitted train and eval steps.

One train step = gradient accumulation over `grad_accum` micro-batches (`lax.scan`, so the
compiled program does not grow with it), one optimizer update (gradient clipping lives in
the optimizer chain), and one aux-loss-free router-bias update from the step's router counts
(DeepSeek-V3 §2.1.2, outside the optimizer: the bias is not a trainable parameter).

Batch letters: G grad_accum micro-batches, B micro-batch size, L sequence length,
Lm MoE layers, E routed experts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from composer_jax.model import loss as loss_lib
from composer_jax.model import moe, transformer
from composer_jax.model.config import ModelConfig
from composer_jax.optim import update_rms_by_group
from composer_jax.train.state import TrainState

Batch = dict  # tokens/targets/segment_ids/positions [.., B, L] int32, loss_mask [.., B, L] f32


def make_loss_fn(model_cfg: ModelConfig, *, loss_chunk: int, z_loss: float) -> Callable:
  """Returns `loss_fn(params, router, batch) -> (token_sum_loss, (parts, aux))`.

  The loss is returned multiplied by the micro-batch's number of target tokens, so that
  summing over micro-batches and dividing by the total token count gives the exact
  token-weighted mean of the full batch whatever the padding of each micro-batch.
  `loss = CE + z_loss_coef * log(Z)^2 (PaLM §5) + balance_loss (DeepSeek-V3 eq. 17)`.
  """

  def loss_fn(params, router, batch):
    variables = {"params": params, "router": router}
    hidden_BxLxD, aux = transformer.forward(
      model_cfg,
      variables,
      batch["tokens"],
      segment_ids=batch["segment_ids"],
      positions=batch["positions"],
    )
    head_DxV = transformer.output_head(model_cfg, params)
    loss, parts = loss_lib.chunked_cross_entropy(
      hidden_BxLxD,
      head_DxV,
      batch["targets"],
      batch["loss_mask"],
      chunk_size=loss_chunk,
      z_loss_coef=z_loss,
    )
    loss = loss + aux["balance_loss"]
    return loss * parts["num_tokens"], (parts, aux)

  return loss_fn


def _moe_metrics(counts_LmxE: jax.Array, aux: dict, dropped: jax.Array) -> dict:
  """Load balance of the step's summed router counts, mean router entropy, and the step's
  `dropped` token-expert assignments (all micro-batches and MoE layers; nonzero only for
  bounded buffers: `capacity`, `expert_parallel` with `ep_capacity_factor`), also as a
  fraction of all routed assignments."""
  if counts_LmxE.size == 0:
    return {}
  load = counts_LmxE.max(-1) / jnp.maximum(counts_LmxE.mean(-1), 1e-9)  # [Lm]
  return {
    "moe/load_max_over_mean": load.mean(),
    "moe/load_max_over_mean_worst": load.max(),
    "moe/router_entropy": aux["router_entropy"].mean(),
    "moe/dropped_tokens": dropped,
    "moe/dropped_fraction": dropped / jnp.maximum(counts_LmxE.sum(), 1.0),
  }


def make_train_step(
  model_cfg: ModelConfig,
  optimizer: optax.GradientTransformation,
  schedule: optax.Schedule,
  labels: Any,
  *,
  loss_chunk: int,
  z_loss: float,
  router_bias_rate: float,
) -> Callable:
  """Returns `train_step(state, batch[G, B, L]) -> (state, metrics)` (not yet jitted).

  Args:
    model_cfg: model architecture.
    optimizer: optax transformation (Muon/AdamW chain with clipping) over `state.params`.
    schedule: the peak-LR schedule, only for logging `lr`.
    labels: optimizer group of each param ('muon' | 'adamw', `optim.param_labels`), to log
      the update RMS per group.
    loss_chunk: vocabulary-projection chunk size of the chunked cross-entropy.
    z_loss: z-loss coefficient.
    router_bias_rate: gamma of the bias update `b += gamma * sign(mean_load - load)`.
  """
  loss_fn = make_loss_fn(model_cfg, loss_chunk=loss_chunk, z_loss=z_loss)
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(state: TrainState, batch: Batch):
    """One optimizer step on `batch` of [G, B, L] arrays (G = grad_accum micro-batches)."""

    def accumulate(carry, mb):
      grads, loss_sum, ce_sum, z_sum, n_sum, counts = carry
      (loss_sum_i, (parts, aux)), g = grad_fn(state.params, state.router, mb)
      n = parts["num_tokens"]
      carry = (
        jax.tree.map(jnp.add, grads, g),
        loss_sum + loss_sum_i,
        ce_sum + parts["ce"] * n,
        z_sum + parts["z_loss"] * n,
        n_sum + n,
        counts + aux["router_counts"],
      )
      return carry, {
        "router_entropy": aux["router_entropy"],
        "dropped_tokens": aux["dropped_tokens"],
        "balance_loss": aux["balance_loss"],
      }

    lm = model_cfg.num_moe_layers
    zero = jnp.zeros((), jnp.float32)
    init = (
      jax.tree.map(jnp.zeros_like, state.params),
      zero,
      zero,
      zero,
      zero,
      jnp.zeros((lm, model_cfg.n_routed_experts), jnp.float32),
    )
    (grads, loss_sum, ce_sum, z_sum, n_sum, counts), per_micro = jax.lax.scan(
      accumulate, init, batch
    )
    n_tot = jnp.maximum(n_sum, 1.0)
    grads = jax.tree.map(lambda g: g / n_tot, grads)

    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    router = state.router
    if lm:
      bias = moe.update_router_bias(router["moe_layers"]["moe"]["bias"], counts, router_bias_rate)
      router = {**router, "moe_layers": {**router["moe_layers"], "moe": {"bias": bias}}}
    rng, _ = jax.random.split(state.rng)

    aux = jax.tree.map(lambda x: x.mean(0), per_micro)
    metrics = {
      "loss": loss_sum / n_tot,
      "ce": ce_sum / n_tot,
      # Logged at the scale it enters `loss` (coef x mean log(Z)^2); `logz_sq` is the raw mean.
      "z_loss": z_loss * z_sum / n_tot,
      "logz_sq": z_sum / n_tot,
      "balance_loss": aux["balance_loss"],
      "num_tokens": n_sum,
      "grad_norm": optax.tree.norm(grads),
      "update_norm": optax.tree.norm(updates),
      "lr": schedule(state.step),
      **_moe_metrics(counts, aux, per_micro["dropped_tokens"].sum()),
      **{f"update_rms/{k}": v for k, v in update_rms_by_group(updates, labels).items()},
    }
    new_state = TrainState(
      step=state.step + 1, params=params, router=router, opt_state=opt_state, rng=rng
    )
    return new_state, metrics

  return train_step


def make_eval_step(model_cfg: ModelConfig, *, loss_chunk: int) -> Callable:
  """Returns `eval_step(state, batch) -> (ce_token_sum, num_tokens)` on a [B, L] batch."""
  loss_fn = make_loss_fn(model_cfg, loss_chunk=loss_chunk, z_loss=0.0)

  def eval_step(state: TrainState, batch: Batch):
    _, (parts, _) = loss_fn(state.params, state.router, batch)
    return parts["ce"] * parts["num_tokens"], parts["num_tokens"]

  return eval_step
