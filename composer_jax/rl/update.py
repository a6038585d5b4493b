"""The RL update, not yet jitted: `make_update(model_cfg, loss_cfg, optimizer)`.

One optimizer step on a batch of packed trajectories: loss = RL + sd_coef * SD
(`rl.losses.make_loss_fn`), the teacher forward on the teacher weights
(`rl.teacher_weights`) under stop_gradient; with `loss.log_term_grads` also the RL and SD
gradient norms and their cosine (`rl.sd_probes.term_grad_stats`: one forward, one backward per
term through `jax.vjp`); with probe-only teacher rows (`gap_row`) the teacher gap
(`rl.sd_probes.teacher_gap`) on the same forward. Jitted on the run's mesh by
`rl.programs`, as `train.step` is by `train.programs`. The router bias is not trained during
RL (it has no gradient and RL has no router-count update).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig
from composer_jax.rl import losses, sd_probes, teacher


def make_update(model_cfg: ModelConfig, loss_cfg, optimizer: optax.GradientTransformation):
  """(`update`, `old_policy`), not jitted.

  `update(params, opt_state, router, batch, teacher_params, teacher_batch)` ->
  (params, opt_state, metrics): one optimizer step on `batch`. `teacher_params` =
  `teacher_weights.teacher_variables(...)` (a tuple of param trees) and `teacher_batch` from
  `build_teacher_batch` (full rows, or extension rows over the student's prefix cache:
  `teacher.teacher_hidden`), or both None (RL only).
  `old_policy(params, router, batch)` -> {'old_logprobs' [B, L], 'advantage' [B]}: what K
  minibatch epochs hold fixed (`losses.make_old_policy_fn`).
  """
  loss_fn = losses.make_loss_fn(loss_cfg)
  old_policy_fn = losses.make_old_policy_fn(loss_cfg)

  def hidden(params, router, b):
    h, _ = transformer.forward(
      model_cfg,
      {"params": params, "router": router},
      b["tokens"],
      segment_ids=b["segment_ids"],
      positions=b["positions"],
    )
    return h

  def objective(params, router, batch, teacher_params, teacher_batch):
    teacher_out = None
    if teacher_batch is not None:
      teacher_out = tuple(
        jax.lax.stop_gradient(
          (
            teacher.teacher_hidden(
              model_cfg, {"params": p, "router": router}, batch, teacher_batch
            ),
            transformer.output_head(model_cfg, p),
          )
        )
        for p in teacher_params
      )
    student, head = hidden(params, router, batch), transformer.output_head(model_cfg, params)
    loss, metrics = loss_fn(student, head, batch, teacher_out, teacher_batch)
    if teacher_batch is not None and "gap_row" in teacher_batch:
      metrics.update(sd_probes.teacher_gap(loss_cfg, student, head, teacher_out, teacher_batch))
    return loss, metrics

  def _term_grads(params, router, batch, teacher_params, teacher_batch):
    """Total gradient and metrics with `sd_probes.term_grad_stats` of the RL part (loss minus
    sd_coef * SD) and the SD term: one forward, two backward passes."""

    def terms(p):
      loss, metrics = objective(p, router, batch, teacher_params, teacher_batch)
      sd = metrics.get("sd_loss", jnp.zeros_like(loss))
      return jnp.stack([loss - loss_cfg.sd_coef * sd, sd]), metrics

    _, vjp, metrics = jax.vjp(terms, params, has_aux=True)
    (g_rl,), (g_sd,) = vjp(jnp.array([1.0, 0.0])), vjp(jnp.array([0.0, 1.0]))
    metrics.update(sd_probes.term_grad_stats(g_rl, g_sd))
    return jax.tree.map(lambda a, b: a + loss_cfg.sd_coef * b, g_rl, g_sd), metrics

  def update(params, opt_state, router, batch, teacher_params=None, teacher_batch=None):
    if loss_cfg.log_term_grads:
      grads, metrics = _term_grads(params, router, batch, teacher_params, teacher_batch)
    else:
      (_, metrics), grads = jax.value_and_grad(objective, has_aux=True)(
        params, router, batch, teacher_params, teacher_batch
      )
    updates, opt_state = optimizer.update(grads, opt_state, params)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return optax.apply_updates(params, updates), opt_state, metrics

  def old_policy(params, router, batch):
    return old_policy_fn(
      hidden(params, router, batch), transformer.output_head(model_cfg, params), batch
    )

  return update, old_policy
