"""The RL + self-distillation loss: total = RL + sd_coef * SD, one jitted function.

RL (all sampled model tokens of every trajectory), a PPO/GRPO clipped policy gradient:
  w_t = pi_theta(y_t) / pi_old(y_t),  A = group-relative advantage of the trajectory,
  l_t = -tis_t * min(w_t A, clip(w_t, 1 - eps_lo, 1 + eps_hi) A)       (DAPO clip-higher)
  tis_t = min(pi_old(y_t) / pi_sampler(y_t), C) under stop_gradient: truncated importance sampling
  for staleness and the sampler/trainer mismatch (Yao et al. 2025, "Your efficient RL framework
  secretly brings you off-policy RL training"). pi_sampler = the behaviour log-probs the sampler
  recorded (`batch['sampler_logprobs']`); pi_old = the trainer's log-probs under the weights at
  the start of the update (`batch['old_logprobs']`, from `old_policy`, computed once before the
  first of K epochs: PPO's convention, `rl.epochs`); absent, pi_old = stop_gradient(pi_theta)
  (one update per batch: w_t = 1, tis_t = the trainer/sampler ratio).
  A = `batch['advantage']` [B] when given (computed once on the whole batch by `old_policy`, so
  minibatches that split a GRPO group keep its advantages), else computed here from the rewards.
  Logged: clip_frac (= clip_frac_low + clip_frac_high), ratio_mean/max, is_weight_mean/max (the
  untruncated pi_old / pi_sampler), is_truncated_frac (share of tokens with it > C), tis_weight
  (mean truncated weight), staleness_mean/max (`batch['staleness']` [B] optimizer updates between
  the sampling weights and the updated ones, when given), all over model tokens / valid rows.
  Optional KL to a reference policy, d = log pi_theta(y) - log pi_ref(y) on sampled tokens:
    k1 = d, k2 = d^2 / 2, k3 = exp(-d) + d - 1.
  As *values* k1 and k3 are unbiased estimates of KL(pi_theta || pi_ref). As *losses* (gradient
  through log pi_theta on on-policy samples): k1 has zero expected gradient (E[grad log pi] = 0),
  k3's gradient is biased (it is the gradient of the forward KL(pi_ref || pi_theta)), and k2's
  expected gradient is exactly grad KL(pi_theta || pi_ref).

Per-turn penalty (the reward-shaping baseline to SD; `turn_penalty` c > 0): the sampled tokens of
the flagged turns (`batch['flagged_mask']` [B, L], `trajectory.turn_token_mask`) get the advantage
A - c instead of A, i.e. a dense reward of -c on that turn's tokens, the rest of the objective
unchanged. Logged: penalized_tokens.

SD (sampled tokens of the target turns only): divergences.token_divergence between the student
(original context) and the teacher (same model with the hint in context, stop_gradient), the first
`skip_first_tokens` of each turn excluded; with `sd_is_clip` c > 0 each token's divergence is
weighted by min(pi_theta(y) / pi_sampler(y), c) under stop_gradient (SDPO's importance-weight
clip). Teacher rows with `teacher_batch['gap_row']` = 1 are probes only (`sd_probes.teacher_gap`):
never distilled. What the teacher reads and how it enters the objective is `sd_variant`
(`rl.sd_variants`): 'hint' and 'sdpo' add sd_coef * SD; 'rlvr' adds no SD term and instead
reweights the RL advantage of the distilled tokens (`advantage_weights`).

Normalizers (each term its own): 'sequence_mean' (mean per sequence, then over sequences; GRPO,
length-biased), 'token_mean' (sum / all active tokens of the term; DAPO), 'constant' (sum / a
fixed number; Dr. GRPO); for SD also 'batch_tokens' (the default): the SD sum over distilled
tokens / all active model tokens of the batch, the RL term's token_mean denominator, so both
terms are per-token means on one scale and a flagged token weighs as much in SD as any token in
RL. The SD term's old 'token_mean' (/ distilled tokens only, the committed tool-calling figures
up to 2026-12-05) makes each flagged token weigh 1 / sd_token_frac times more.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections

from composer_jax.model import vocab_chunks
from composer_jax.model.vocab_chunks import Logits
from composer_jax.rl import advantages, divergences, sd_variants, teacher_weights

NORMALIZATIONS = ("sequence_mean", "token_mean", "constant")
SD_NORMALIZATIONS = (*NORMALIZATIONS, "batch_tokens")
KL_ESTIMATORS = ("k1", "k2", "k3")


def normalize(values: jax.Array, mask: jax.Array, kind: str, constant: float = 0.0) -> jax.Array:
  """Reduces per-token `values` [R, L] over `mask` [R, L] to a scalar.

  'constant' divides the masked sum by `constant` (0: R * L).
  """
  total = jnp.where(mask > 0, values, 0.0)
  if kind == "token_mean":
    return total.sum() / jnp.maximum(mask.sum(), 1.0)
  if kind == "sequence_mean":
    count = mask.sum(-1)
    per_seq = total.sum(-1) / jnp.maximum(count, 1.0)
    return per_seq.sum() / jnp.maximum((count > 0).sum(), 1)
  if kind == "constant":
    return total.sum() / (constant if constant > 0 else mask.size)
  raise ValueError(f"normalization={kind!r}; valid: {NORMALIZATIONS}")


def kl_estimate(logp: jax.Array, logp_ref: jax.Array, estimator: str) -> jax.Array:
  """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs (see module docstring)."""
  d = logp - logp_ref
  if estimator == "k1":
    return d
  if estimator == "k2":
    return 0.5 * d**2
  if estimator == "k3":
    return jnp.expm1(-d) + d
  raise ValueError(f"ref_kl_estimator={estimator!r}; valid: {KL_ESTIMATORS}")


def policy_loss(logp, old_logp, sampler_logp, advantage, *, eps_low, eps_high, tis_cap):
  """Per-token clipped policy-gradient loss; all inputs/outputs [...] (same shape).

  Returns:
    (loss, stats): stats has per-token `clipped_low`, `clipped_high` (1.0 where the clip zeroes
    the gradient: A < 0 and w < 1 - eps_low; A > 0 and w > 1 + eps_high), `ratio` (w, no
    gradient), `is_weight` (pi_old / pi_sampler, untruncated), `tis` (the weight applied: the
    truncated one, or 1 with tis_cap 0) and `truncated` (1.0 where is_weight > tis_cap > 0).
  """
  ratio = jnp.exp(logp - old_logp)
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  surrogate = jnp.minimum(ratio * advantage, clipped * advantage)
  is_weight = jax.lax.stop_gradient(jnp.exp(old_logp - sampler_logp))
  tis = jnp.minimum(is_weight, tis_cap) if tis_cap > 0 else jnp.ones_like(logp)
  f32 = lambda x: x.astype(jnp.float32)
  stats = dict(
    clipped_low=f32((advantage < 0) & (ratio < 1.0 - eps_low)),
    clipped_high=f32((advantage > 0) & (ratio > 1.0 + eps_high)),
    ratio=jax.lax.stop_gradient(ratio),
    is_weight=is_weight,
    tis=tis,
    truncated=f32((tis_cap > 0) & (is_weight > tis_cap)),
  )
  return -tis * surrogate, stats


def sampled_logprobs(cfg, hidden: jax.Array, head: jax.Array, targets: jax.Array):
  """(log pi(targets) [B, L], entropy [B, L]) of softmax(hidden [B, L, D] @ head [D, V])."""
  b, length, d = hidden.shape
  per_token = lambda h, y: token_logprob_entropy(h, head, y, cfg.vocab_chunk_size)
  logp, entropy = vocab_chunks.map_tokens(
    per_token, cfg.token_chunk_size, hidden.reshape(b * length, d), targets.reshape(-1)
  )
  return logp.reshape(b, length), entropy.reshape(b, length)


def batch_advantages(cfg, batch) -> jax.Array:
  """GRPO group-relative advantages [B] of `batch` (`advantages.group_advantages`)."""
  rows = batch["reward"].shape[0]
  return advantages.group_advantages(
    batch["reward"],
    batch["group_index"],
    batch["valid"],
    num_groups=rows,
    normalize_std=cfg.advantage_std_normalize,
    eps=cfg.advantage_eps,
  )


def make_old_policy_fn(cfg: ml_collections.ConfigDict) -> Callable:
  """Jitted `old_policy(hidden [B, L, D], head [D, V], batch) -> {'old_logprobs' [B, L],
  'advantage' [B]}`: what K minibatch epochs hold fixed, computed once from the pre-update
  weights (no gradient) and merged into the batch before `rl.epochs.run_epochs`."""
  validate(cfg)
  cfg = ml_collections.FrozenConfigDict(cfg)

  @jax.jit
  def old_policy(hidden, head, batch):
    logp, _ = sampled_logprobs(cfg, jax.lax.stop_gradient(hidden), head, batch["targets"])
    mask = batch["model_mask"] * batch["valid"][:, None]
    return dict(
      old_logprobs=jax.lax.stop_gradient(jnp.where(mask > 0, logp, 0.0)),
      advantage=batch_advantages(cfg, batch),
    )

  return old_policy


def token_logprob_entropy(hidden: jax.Array, head: jax.Array, targets: jax.Array, chunk: int):
  """log pi(targets) [N] and the entropy [N] of softmax(hidden [N, D] @ head [D, V]), chunked."""
  lse, z_y = vocab_chunks.lse_and_target_logit(hidden, head, targets, chunk)
  return z_y - lse.lse(), lse.entropy()


_NON_NEGATIVE = (
  "sd_coef",
  "turn_penalty",
  "ref_kl_coef",
  "tis_cap",
  "advantage_eps",
  "rl_constant",
  "sd_constant",
  "sd_is_clip",
  "rlvr_weight_clip",
)


def validate(cfg: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming the first bad field of a `default_loss_config()`."""
  choices = dict(
    rl_normalization=NORMALIZATIONS,
    sd_normalization=SD_NORMALIZATIONS,
    sd_variant=sd_variants.VARIANTS,
    ref_kl_estimator=KL_ESTIMATORS,
    divergence=divergences.DIVERGENCES,
    support=divergences.SUPPORTS,
    teacher=teacher_weights.TEACHERS,
  )
  for name, valid in choices.items():
    if cfg[name] not in valid:
      raise ValueError(f"{name}={cfg[name]!r}; valid: {valid}")
  if not (0 <= cfg.clip_eps_low < 1 and cfg.clip_eps_high >= 0):
    raise ValueError(
      f"clip_eps_low={cfg.clip_eps_low} must be in [0, 1) and clip_eps_high="
      f"{cfg.clip_eps_high} >= 0"
    )
  # Weights, caps and divisors: a NaN or negative one would reach the update unnoticed (a NaN
  # coefficient: NaN parameters after the warm-up, with a finite loss logged).
  for name in _NON_NEGATIVE:
    if not (math.isfinite(cfg[name]) and cfg[name] >= 0):
      raise ValueError(f"{name}={cfg[name]} must be finite and >= 0")
  if cfg.teacher == "ema" and not 0 < cfg.ema_rate <= 1:  # as teacher_weights.ema_update
    raise ValueError(
      f"ema_rate={cfg.ema_rate} must be in (0, 1] (the EMA teacher's step towards the policy)"
    )
  if not 0 < cfg.jsd_beta < 1:
    raise ValueError(f"jsd_beta={cfg.jsd_beta} must be in (0, 1); use forward_kl/reverse_kl")
  if cfg.skip_first_tokens < 0 or cfg.vocab_chunk_size <= 0:
    raise ValueError(
      f"skip_first_tokens={cfg.skip_first_tokens} and vocab_chunk_size="
      f"{cfg.vocab_chunk_size} must be >= 0 and > 0"
    )
  if cfg.sd_variant == "rlvr" and cfg.rlvr_weight_clip < 1:
    raise ValueError(
      f"rlvr_weight_clip={cfg.rlvr_weight_clip} must be >= 1 (advantage weights in [1/c, c])"
    )
  teacher_weights.mixing_weights(cfg)


def _rl_term(cfg, hidden, head, batch, ref, adv_weight=None):
  """Clipped policy gradient (+ reference KL) on hidden [B, L, D] -> (scalar, metrics)."""
  b, length, d = hidden.shape
  mask = batch["model_mask"] * batch["valid"][:, None]
  logp, entropy = sampled_logprobs(cfg, hidden, head, batch["targets"])
  adv = batch["advantage"] if "advantage" in batch else batch_advantages(cfg, batch)
  adv = jnp.broadcast_to(adv[:, None], mask.shape)
  if adv_weight is not None:
    adv = adv * adv_weight
  if cfg.turn_penalty > 0:
    if "flagged_mask" not in batch:
      raise ValueError(
        "turn_penalty > 0 needs batch['flagged_mask'] [B, L] "
        "(trajectory.turn_token_mask of the flagged turns)"
      )
    adv = adv - cfg.turn_penalty * batch["flagged_mask"]
  old = batch.get("old_logprobs", jax.lax.stop_gradient(logp))
  loss, stats = policy_loss(
    logp,
    old,
    batch["sampler_logprobs"],
    adv,
    eps_low=cfg.clip_eps_low,
    eps_high=cfg.clip_eps_high,
    tis_cap=cfg.tis_cap,
  )
  rl = normalize(loss, mask, cfg.rl_normalization, cfg.rl_constant)
  mean = lambda x: normalize(x, mask, "token_mean")
  peak = lambda x: jnp.where(mask > 0, x, 0.0).max()  # ratios and weights are >= 0
  metrics = dict(
    rl_loss=rl,
    clip_frac_low=mean(stats["clipped_low"]),
    clip_frac_high=mean(stats["clipped_high"]),
    clip_frac=mean(stats["clipped_low"] + stats["clipped_high"]),
    ratio_mean=mean(stats["ratio"]),
    ratio_max=peak(stats["ratio"]),
    is_weight_mean=mean(stats["is_weight"]),
    is_weight_max=peak(stats["is_weight"]),
    is_truncated_frac=mean(stats["truncated"]),
    entropy=mean(entropy),
    tis_weight=mean(stats["tis"]),
    num_model_tokens=mask.sum(),
  )
  if cfg.turn_penalty > 0:
    metrics["penalized_tokens"] = (batch["flagged_mask"] * mask).sum()
  if "staleness" in batch:
    valid = batch["valid"] > 0
    stale = batch["staleness"].astype(jnp.float32)
    metrics["staleness_mean"] = jnp.where(valid, stale, 0).sum() / jnp.maximum(valid.sum(), 1)
    metrics["staleness_max"] = jnp.where(valid, stale, 0).max()
  if cfg.ref_kl_coef > 0:
    if ref is None:
      raise ValueError("ref_kl_coef > 0 needs ref=(hidden [B, L, D], head [D, V])")
    ref_logp, _ = vocab_chunks.map_tokens(
      lambda h, y: token_logprob_entropy(h, ref[1], y, cfg.vocab_chunk_size),
      cfg.token_chunk_size,
      jax.lax.stop_gradient(ref[0]).reshape(b * length, d),
      batch["targets"].reshape(-1),
    )
    kl = kl_estimate(logp, jax.lax.stop_gradient(ref_logp).reshape(b, length), cfg.ref_kl_estimator)
    metrics["ref_kl"] = normalize(kl, mask, cfg.rl_normalization, cfg.rl_constant)
    rl = rl + cfg.ref_kl_coef * metrics["ref_kl"]
  return rl, metrics


def slot_outputs(cfg, hidden, head, teacher, teacher_batch, *, kind=None, support=None):
  """`divergences.token_divergence` of student vs teacher on the [T, Lk] slots of
  `teacher_batch` (`kind` / `support` default to cfg's) -> (dict of [T, Lk], mask [T, Lk]: the
  sampled slots after `skip_first_tokens`, probe rows included)."""
  weights = teacher_weights.mixing_weights(cfg)
  if len(teacher) != len(weights):
    raise ValueError(
      f"teacher={cfg.teacher!r} needs {len(weights)} (hidden, head) pairs, got {len(teacher)}"
    )
  rows, lk = teacher_batch["slot_student_pos"].shape
  mask = teacher_batch["slot_mask"] * (jnp.arange(lk) >= cfg.skip_first_tokens)
  hs = hidden[teacher_batch["student_row"][:, None], teacher_batch["slot_student_pos"]]
  hts = [h[jnp.arange(rows)[:, None], teacher_batch["slot_teacher_pos"]] for h, _ in teacher]
  flat = lambda x: x.reshape(rows * lk, *x.shape[2:])

  def per_token(hs, y, *hts):
    return divergences.token_divergence(
      vocab_chunks.single(hs, head),
      Logits(tuple(hts), tuple(w for _, w in teacher), weights),
      y,
      kind=kind or cfg.divergence,
      support=support or cfg.support,
      beta=cfg.jsd_beta,
      top_k=cfg.top_k,
      chunk_size=cfg.vocab_chunk_size,
    )

  out = vocab_chunks.map_tokens(
    per_token, cfg.token_chunk_size, flat(hs), flat(teacher_batch["slot_target"]), *map(flat, hts)
  )
  return jax.tree.map(lambda x: x.reshape(rows, lk), out), mask


def distilled_mask(teacher_batch, mask: jax.Array) -> jax.Array:
  """`mask` [T, Lk] without the probe-only rows (`gap_row`)."""
  if "gap_row" not in teacher_batch:
    return mask
  return mask * (1.0 - teacher_batch["gap_row"][:, None])


def sd_term(cfg, hidden, head, teacher, teacher_batch, batch=None):
  """Self-distillation on the [T, Lk] slots of `teacher_batch` -> (scalar, metrics).

  `batch` (the student batch) gives the RL token count of 'batch_tokens' and the sampler
  log-probs of `sd_is_clip`; both need it."""
  if batch is None and (cfg.sd_normalization == "batch_tokens" or cfg.sd_is_clip > 0):
    raise ValueError(
      f"sd_normalization={cfg.sd_normalization!r} / sd_is_clip={cfg.sd_is_clip} need the "
      "student batch (sd_term(..., batch=))"
    )
  out, mask = slot_outputs(cfg, hidden, head, teacher, teacher_batch)
  mask = distilled_mask(teacher_batch, mask)
  mean = lambda x: normalize(x, mask, "token_mean")
  hit = (out["teacher_argmax"] == teacher_batch["slot_target"]).astype(jnp.float32)
  divergence = out["divergence"]
  metrics = {}
  if cfg.sd_is_clip > 0:
    sampler = batch["sampler_logprobs"][
      teacher_batch["student_row"][:, None], teacher_batch["slot_student_pos"]
    ]
    w = jax.lax.stop_gradient(jnp.minimum(jnp.exp(out["logp"] - sampler), cfg.sd_is_clip))
    divergence = w * divergence
    metrics["sd_is_weight"] = mean(w)
  if cfg.sd_normalization == "batch_tokens":
    rl_tokens = (batch["model_mask"] * batch["valid"][:, None]).sum()
    sd = jnp.where(mask > 0, divergence, 0.0).sum() / jnp.maximum(rl_tokens, 1.0)
  else:
    sd = normalize(divergence, mask, cfg.sd_normalization, cfg.sd_constant)
  metrics.update(
    sd_loss=sd,
    sd_gap_kl=mean(out["reverse_kl"]),
    teacher_accuracy=mean(hit),
    num_distilled_tokens=mask.sum(),
  )
  return sd, metrics


def advantage_weights(cfg, hidden, head, teacher, teacher_batch, batch):
  """Self-distilled RLVR's token weights ([B, L], 1 off the distilled slots; no gradient):
  w_t = exp(clip(sd_coef * sign(A) * (log q(y_t) - log pi(y_t)), -log c, log c)),
  c = `rlvr_weight_clip`, A the row's advantage. The reward sets the sign of A_t = w_t A: a token
  the teacher likes less than the student is pushed down harder in a failure and up less in a
  success, never the other way round. -> (weights, metrics)."""
  sg = jax.lax.stop_gradient
  out, mask = slot_outputs(cfg, sg(hidden), head, teacher, teacher_batch, support="sampled")
  mask = distilled_mask(teacher_batch, mask)
  row = teacher_batch["student_row"]
  adv = batch["advantage"] if "advantage" in batch else batch_advantages(cfg, batch)
  sign = jnp.sign(adv)[row][:, None]
  bound = math.log(cfg.rlvr_weight_clip)
  w = jnp.exp(jnp.clip(cfg.sd_coef * sign * (out["logq"] - out["logp"]), -bound, bound))
  w = sg(jnp.where(mask > 0, w, 1.0))
  weights = jnp.ones(batch["targets"].shape, jnp.float32)
  weights = weights.at[row[:, None], teacher_batch["slot_student_pos"]].multiply(w)
  metrics = dict(
    rlvr_weight_mean=normalize(w, mask, "token_mean"),
    num_distilled_tokens=mask.sum(),
    sd_gap_kl=normalize(out["logp"] - out["logq"], mask, "token_mean"),
  )
  return weights, metrics


def make_loss_fn(cfg: ml_collections.ConfigDict) -> Callable:
  """Returns the jitted `loss_fn(student_hidden, head, batch, teacher=None, teacher_batch=None,
  ref=None) -> (loss, metrics)`.

  Args of loss_fn:
    student_hidden: [B, L, D] model hidden states (after the final norm) on `batch['tokens']`.
    head: [D, V] output head (`output_head(cfg, params)`).
    batch: `trajectory.pack_batch` arrays; optional 'old_logprobs' [B, L].
    teacher: tuple of (hidden [T, Lt, D], head [D, V]) on `teacher_batch['tokens']`, one per
      `teacher_weights.teacher_variables(cfg, ...)` set in that order (trust_region: (initial,
      current)), or None for RL only. No gradient flows into it.
    teacher_batch: `teacher.build_teacher_batch` arrays.
    ref: (hidden [B, L, D], head [D, V]) of the reference policy, when ref_kl_coef > 0.
  Metrics: rl_loss, sd_loss, ref_kl (if on), clip_frac_low/high, entropy, tis_weight,
    sd_gap_kl (mean KL(student || teacher) on the SD support; 'rlvr': its one-sample estimate),
    teacher_accuracy (teacher argmax == sampled token), sd_is_weight (with sd_is_clip),
    rlvr_weight_mean ('rlvr'), sd_token_frac (distilled / model tokens), token counts.
  """
  validate(cfg)
  cfg = ml_collections.FrozenConfigDict(cfg)

  @jax.jit
  def loss_fn(student_hidden, head, batch, teacher=None, teacher_batch=None, ref=None):
    if (teacher is None) != (teacher_batch is None):
      raise ValueError("pass both teacher and teacher_batch (self-distillation) or neither")
    weights, sd_metrics = None, {}
    if teacher is not None and cfg.sd_variant == "rlvr":
      weights, sd_metrics = advantage_weights(
        cfg, student_hidden, head, teacher, teacher_batch, batch
      )
    loss, metrics = _rl_term(cfg, student_hidden, head, batch, ref, weights)
    if teacher is not None:
      if cfg.sd_variant != "rlvr":
        sd, sd_metrics = sd_term(cfg, student_hidden, head, teacher, teacher_batch, batch)
        loss = loss + cfg.sd_coef * sd
      metrics.update(sd_metrics)
      metrics["sd_token_frac"] = sd_metrics["num_distilled_tokens"] / jnp.maximum(
        metrics["num_model_tokens"], 1.0
      )
    metrics["loss"] = loss
    return loss, metrics

  return loss_fn
