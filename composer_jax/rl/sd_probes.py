"""Probes of self-distillation: what the SD term is doing, measured on fixed flagged contexts.

A probe set is a fixed, held-out list of flagged turns (trajectories never trained on, each with
its hint), packed once: the student batch (`trajectory.pack_batch`), the teacher batch
(`teacher.build_teacher_batch`, the hint before the flagged turn) and, per teacher row, the slot
of the decisive token (`probe_slot`, e.g. the tool id of `call TOOL <eot>`) and the id the hint
points to (`good_id`, e.g. the offered alias). The slot's sampled token is the faulty one
(`bad_id`, e.g. the unavailable tool). At every logged step, `make_probe_fn` gives:

  probe_kl            mean over the SD slots (after `skip_first_tokens`) of the full-vocabulary
                      reverse KL(student || teacher): the gap the SD term minimises, exactly as
                      `losses.sd_term` measures it (`sd_gap_kl`), on the same contexts every step.
  probe_p_bad / probe_p_good                   the current model without the hint: pi(bad_id),
                                               pi(good_id) at the probe slot;
  probe_p_bad_hint / probe_p_good_hint         the current model with the hint in context;
  probe_teacher_p_good                         the teacher (its weights, with the hint).
  All probabilities are means over probe rows.

The teacher gap (`gap_targets`, `teacher_gap`), measured on every RL batch (`rl.gap_rows` > 0),
also in arms without SD: does the hinted teacher give more probability than the student to what
*successful* episodes did? For each flagged turn k of an episode with a successful sibling
(reward >= `rl.success_reward`, not itself), a probe-only teacher row (`gap_row` 1, never
distilled) reads the sibling's corresponding turn (the model turn of the same ordinal) with the
flagged turn's hint; on its sampled tokens (after `skip_first_tokens`)

  teacher_gap     = mean over rows of (mean over the row's tokens of log q(y_t) - log pi(y_t)),
  teacher_gap_se  = the standard error of that mean over rows (95% interval: +- 1.96 se),
  teacher_gap_rows, and teacher_gap_flagged = the token mean of log q - log pi on the
  distilled (flagged) turns themselves, what the failing episodes did. Metrics stay finite
  (records compare bit-exact on resume):
  with fewer than 2 rows teacher_gap_se is 0, without SD rows teacher_gap_flagged is 0 — read
  them with teacher_gap_rows and num_distilled_tokens.

A positive teacher_gap says SD would move the student towards what succeeded (the OPSD law,
arXiv 2605.30070: the gain is predicted by this initial gap).

`term_grad_stats(g_rl, g_sd)`: the norms of the RL and SD gradients and their cosine (are the
two terms fighting, is SD drowned?); the SD token fraction is `losses`' `sd_token_frac`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig
from composer_jax.rl import losses, sd_variants, teacher_weights
from composer_jax.rl.teacher import DistillTarget, build_teacher_batch
from composer_jax.rl.trajectory import Trajectory, pack_batch


def build_probe_set(
  trajectories: Sequence[Trajectory],
  targets: Sequence[DistillTarget],
  probe_slots: Sequence[int],
  good_ids: Sequence[int],
  *,
  seq_len: int,
  teacher_seq_len: int,
  turn_len: int,
  pad_id: int = 0,
) -> dict[str, dict[str, np.ndarray]]:
  """{'batch': student batch [P, L], 'teacher_batch': teacher rows [T, Lt] with `probe_slot`
  [T] and `good_id` [T] added}, one teacher row per target (T = len(targets))."""
  if not len(targets) == len(probe_slots) == len(good_ids):
    raise ValueError(
      f"{len(targets)} targets, {len(probe_slots)} probe_slots and "
      f"{len(good_ids)} good_ids: give one of each per probe"
    )
  batch = pack_batch(trajectories, [seq_len], pad_id=pad_id)
  tb = build_teacher_batch(
    trajectories, batch, targets, buckets=[teacher_seq_len], turn_buckets=[turn_len], pad_id=pad_id
  )
  slots = np.asarray(probe_slots, np.int32)
  if np.any(tb["slot_mask"][np.arange(len(slots)), slots] == 0):
    raise ValueError(
      f"probe_slots {slots.tolist()} must be sampled tokens of their turns "
      f"(slot counts {tb['slot_mask'].sum(-1).astype(int).tolist()})"
    )
  tb["probe_slot"], tb["good_id"] = slots, np.asarray(good_ids, np.int32)
  return {"batch": batch, "teacher_batch": tb}


def _probs_at(hidden: jax.Array, head: jax.Array, ids: Sequence[jax.Array], chunk: int):
  """pi(ids[i]) [T] for each id array of `ids`, from hidden [T, D] @ head [D, V]."""
  return [jnp.exp(losses.token_logprob_entropy(hidden, head, i, chunk)[0]) for i in ids]


def probe_metrics(
  cfg: ml_collections.ConfigDict,
  student_hidden: jax.Array,
  hinted_hidden: jax.Array,
  head: jax.Array,
  teacher: tuple,
  probe: dict,
) -> dict[str, jax.Array]:
  """Probe metrics (module docstring) from hidden states after the final norm.

  Args:
    cfg: the run's `default_loss_config()` (skip_first_tokens, teacher mixing, chunking).
    student_hidden: [P, L, D] current weights on `probe['batch']['tokens']`.
    hinted_hidden: [T, Lt, D] current weights on `probe['teacher_batch']['tokens']`.
    head: [D, V] current output head.
    teacher: ((hidden [T, Lt, D], head [D, V]), ...) on the teacher weights, as `losses`.
    probe: `build_probe_set` output.
  """
  tb = probe["teacher_batch"]
  rows = jnp.arange(tb["probe_slot"].shape[0])
  slot = tb["probe_slot"]
  gap = ml_collections.ConfigDict(dict(cfg))
  gap.update(divergence="reverse_kl", support="full", sd_normalization="token_mean", sd_is_clip=0.0)
  _, sd = losses.sd_term(gap, student_hidden, head, teacher, tb)
  bad, good = tb["slot_target"][rows, slot], tb["good_id"]
  at_student = student_hidden[tb["student_row"], tb["slot_student_pos"][rows, slot]]
  at_teacher = tb["slot_teacher_pos"][rows, slot]
  chunk = cfg.vocab_chunk_size
  p_bad, p_good = _probs_at(at_student, head, (bad, good), chunk)
  p_bad_h, p_good_h = _probs_at(hinted_hidden[rows, at_teacher], head, (bad, good), chunk)
  # The teacher's own probability of the good id: its mixed logits (trust region) when several.
  weights = teacher_weights.mixing_weights(cfg)
  t_logits = sum(
    w * (h[rows, at_teacher] @ th) for w, (h, th) in zip(weights, teacher, strict=True)
  )
  p_teacher = jnp.exp(jax.nn.log_softmax(t_logits)[rows, good])
  return dict(
    probe_kl=sd["sd_gap_kl"],
    probe_p_bad=p_bad.mean(),
    probe_p_good=p_good.mean(),
    probe_p_bad_hint=p_bad_h.mean(),
    probe_p_good_hint=p_good_h.mean(),
    probe_teacher_p_good=p_teacher.mean(),
  )


def make_probe_fn(model_cfg: ModelConfig, loss_cfg: ml_collections.ConfigDict) -> Callable:
  """`probe(params, router, teacher_params, probe) -> metrics` (`probe_metrics`; jit it):
  forwards of the current `params` on the probe's student and hinted rows and of each teacher
  weight set (`teacher_weights.teacher_variables`) on the hinted rows."""
  cfg = ml_collections.FrozenConfigDict(loss_cfg)

  def hidden(params, router, b):
    return transformer.forward(
      model_cfg,
      {"params": params, "router": router},
      b["tokens"],
      segment_ids=b["segment_ids"],
      positions=b["positions"],
    )[0]

  def probe(params, router, teacher_params, probe_set):
    tb = probe_set["teacher_batch"]
    teacher = tuple(
      (hidden(p, router, tb), transformer.output_head(model_cfg, p)) for p in teacher_params
    )
    return probe_metrics(
      cfg,
      hidden(params, router, probe_set["batch"]),
      hidden(params, router, tb),
      transformer.output_head(model_cfg, params),
      teacher,
      probe_set,
    )

  return probe


def term_grad_stats(g_rl, g_sd) -> dict[str, jax.Array]:
  """{'rl_grad_norm', 'sd_grad_norm', 'rl_sd_grad_cos'} of two gradient trees (cosine 0 when
  either is zero)."""
  n_rl, n_sd = optax.tree.norm(g_rl), optax.tree.norm(g_sd)
  dot = optax.tree.vdot(g_rl, g_sd)
  return dict(
    rl_grad_norm=n_rl, sd_grad_norm=n_sd, rl_sd_grad_cos=dot / jnp.maximum(n_rl * n_sd, 1e-30)
  )


def gap_targets(
  targets: Sequence[DistillTarget],
  trajectories: Sequence[Trajectory],
  *,
  success_reward: float,
  limit: int,
) -> list[DistillTarget]:
  """Probe targets of the teacher gap (module docstring): per flagged target with a successful
  sibling, (sibling, its model turn of the same ordinal, the flagged turn's hint); each sibling
  turn once, at most `limit`."""
  success = sd_variants.successes(trajectories, success_reward)
  out, seen = [], set()
  for t in targets:
    sibling = sd_variants.sibling_success(trajectories, t.trajectory_index, success)
    if sibling is None:
      continue
    model_turns = lambda tr: [k for k in range(tr.num_turns) if tr.is_model_turn(k)]
    ordinal = model_turns(trajectories[t.trajectory_index]).index(t.turn)
    turns = model_turns(trajectories[sibling])
    if ordinal < len(turns) and (sibling, turns[ordinal]) not in seen:
      seen.add((sibling, turns[ordinal]))
      out.append(DistillTarget(sibling, turns[ordinal], tuple(t.hint)))
  return out[:limit]


def teacher_gap(cfg, student_hidden, head, teacher, teacher_batch) -> dict[str, jax.Array]:
  """teacher_gap, teacher_gap_se, teacher_gap_rows, teacher_gap_flagged (module docstring) from
  the student hidden [B, L, D], head [D, V] and the teacher's (hidden, head) pairs on
  `teacher_batch` (with `gap_row` [T]); no gradient."""
  sg = jax.lax.stop_gradient
  out, mask = losses.slot_outputs(
    cfg, sg(student_hidden), sg(head), teacher, teacher_batch, kind="reverse_kl", support="sampled"
  )
  delta = out["logq"] - out["logp"]
  gap = mask * teacher_batch["gap_row"][:, None]
  count = gap.sum(-1)
  has = (count > 0).astype(jnp.float32)
  per_row = jnp.where(gap > 0, delta, 0.0).sum(-1) / jnp.maximum(count, 1.0)
  n = has.sum()
  mean = (per_row * has).sum() / jnp.maximum(n, 1.0)
  var = (has * (per_row - mean) ** 2).sum() / jnp.maximum(n - 1.0, 1.0)
  flagged = losses.distilled_mask(teacher_batch, mask)
  return dict(
    teacher_gap=mean,
    teacher_gap_se=jnp.where(n > 1, jnp.sqrt(var / jnp.maximum(n, 1.0)), 0.0),
    teacher_gap_rows=n,
    teacher_gap_flagged=losses.normalize(delta, flagged, "token_mean"),
  )
