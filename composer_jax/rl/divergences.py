"""Student-teacher divergences per token, over the vocabulary in chunks.

p = student pi_theta(.|x, y<t), q = teacher pi(.|x, hint, y<t) under stop_gradient.
  reverse_kl: KL(p || q) = sum_v p (log p - log q)            (SDPO, arXiv 2601.20802)
  forward_kl: KL(q || p) = sum_v q (log q - log p)
  jsd:        generalized Jensen-Shannon, M = beta q + (1 - beta) p,
              JSD_beta = beta KL(q || M) + (1 - beta) KL(p || M), 0 < beta < 1
              (GKD, arXiv 2306.13649, as in TRL's `generalized_jsd_loss`; beta = 0.5 is the
              symmetric JSD used by OPSD, arXiv 2601.18734).
All three are sums over classes of a pointwise term (`pointwise`), so one formula serves:
  support 'full':  the whole vocabulary, two chunked passes (normalizers, then the sum).
  support 'topk':  the student's top-K ids plus one tail bucket holding the remaining mass of each
                   distribution (p_tail = 1 - sum_topK p); a K+1-class divergence that lower-bounds
                   the full one (data processing). Ids are chosen under stop_gradient.
  support 'sampled': reverse KL only, one sample y ~ p (the sampled token): value
                   d = log p(y) - log q(y) (unbiased for KL), gradient d * grad log p(y)
                   (the score-function gradient of KL(p||q); E_p[grad log p] = 0 removes the +1).
The gradient of full reverse KL w.r.t. student logits is p * (log p - log q - KL): a policy
gradient with per-logit advantage log q - log p.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from composer_jax.model import vocab_chunks
from composer_jax.model.vocab_chunks import Logits, OnlineLse

DIVERGENCES = ("reverse_kl", "forward_kl", "jsd")
SUPPORTS = ("full", "topk", "sampled")


def pointwise(kind: str, logp: jax.Array, logq: jax.Array, beta: float = 0.5) -> jax.Array:
  """Per-class terms whose sum over classes is the divergence; inputs normalized log-probs."""
  if kind == "reverse_kl":
    return jnp.exp(logp) * (logp - logq)
  if kind == "forward_kl":
    return jnp.exp(logq) * (logq - logp)
  if kind == "jsd":
    logm = jnp.logaddexp(jnp.log(beta) + logq, jnp.log1p(-beta) + logp)
    return beta * jnp.exp(logq) * (logq - logm) + (1 - beta) * jnp.exp(logp) * (logp - logm)
  raise ValueError(f"divergence={kind!r}; valid: {DIVERGENCES}")


def with_tail(logp_topk: jax.Array) -> jax.Array:
  """[N, K] log-probs -> [N, K + 1], appending log(1 - sum_K p) (clamped at 1e-30)."""
  covered = jax.nn.logsumexp(logp_topk, axis=-1)
  tail = jnp.log(jnp.maximum(-jnp.expm1(jnp.minimum(covered, 0.0)), 1e-30))
  return jnp.concatenate([logp_topk, tail[:, None]], axis=-1)


def sampled_reverse_kl(logp_y: jax.Array, logq_y: jax.Array) -> jax.Array:
  """[N] surrogate: value log p(y) - log q(y), gradient (log p(y) - log q(y)) grad log p(y)."""
  d = jax.lax.stop_gradient(logp_y - logq_y)
  return d + d * (logp_y - jax.lax.stop_gradient(logp_y))


def token_divergence(
  student: Logits,
  teacher: Logits,
  targets: jax.Array,
  *,
  kind: str,
  support: str,
  beta: float = 0.5,
  top_k: int = 20,
  chunk_size: int = 8192,
) -> dict[str, jax.Array]:
  """Per-token divergence between student and (stop-gradient) teacher logits.

  Args:
    student: student logits as (hidden [N, D], head [D, V]) products.
    teacher: teacher logits, same form; stop_gradient is applied here.
    targets: [N] the sampled tokens.
    kind: one of DIVERGENCES.
    support: one of SUPPORTS ('sampled' requires kind 'reverse_kl').
    beta: JSD mixing weight.
    top_k: K for support 'topk' (< V).
    chunk_size: vocabulary chunk C.

  Returns:
    dict of [N]: 'divergence' (the loss term), 'reverse_kl' (KL(p||q) on the same support: exact,
    K+1-bucket, or the one-sample estimate), 'logp' / 'logq' (of the sampled token),
    'teacher_argmax' (int32).
  """
  if kind not in DIVERGENCES:
    raise ValueError(f"divergence={kind!r}; valid: {DIVERGENCES}")
  if support not in SUPPORTS:
    raise ValueError(f"support={support!r}; valid: {SUPPORTS}")
  if support == "sampled" and kind != "reverse_kl":
    raise ValueError(f"support 'sampled' estimates reverse_kl only, got divergence={kind!r}")
  vocab = student.heads[0].shape[1]
  if support == "topk" and not 0 < top_k < vocab:
    raise ValueError(f"top_k={top_k} must be in (0, vocab={vocab})")
  sg = jax.lax.stop_gradient
  teacher = teacher._replace(hiddens=sg(teacher.hiddens), heads=sg(teacher.heads))
  n = targets.shape[0]

  def first_pass(carry, logits, cols, valid):
    (zs, zt), (lse_s, lse_t, zs_y, zt_y, t_max, t_arg, topk) = logits, carry
    chunk_max = zt.max(-1)
    t_arg = jnp.where(chunk_max > t_max, cols[jnp.argmax(zt, -1)], t_arg)
    if support == "topk":
      # Merge the running top-K with this chunk; carry the teacher logits of the same ids.
      vals_s = jnp.concatenate([topk[0], zs], -1)
      vals_t = jnp.concatenate([topk[1], zt], -1)
      _, idx = jax.lax.top_k(jax.lax.stop_gradient(vals_s), top_k)
      topk = (jnp.take_along_axis(vals_s, idx, -1), jnp.take_along_axis(vals_t, idx, -1))
    return (
      lse_s.update(zs),
      lse_t.update(zt),
      zs_y + vocab_chunks.pick(zs, cols, targets),
      zt_y + vocab_chunks.pick(zt, cols, targets),
      jnp.maximum(t_max, chunk_max),
      t_arg,
      topk,
    )

  empty = jnp.full((n, top_k if support == "topk" else 0), -jnp.inf)
  init = (
    OnlineLse.init(n),
    OnlineLse.init(n),
    jnp.zeros(n),
    jnp.zeros(n),
    jnp.full((n,), -jnp.inf),
    jnp.zeros(n, jnp.int32),
    (empty, empty),
  )
  lse_s, lse_t, zs_y, zt_y, _, t_arg, topk = vocab_chunks.scan_vocab(
    first_pass, init, (student, teacher), chunk_size
  )
  lse_s, lse_t = lse_s.lse(), lse_t.lse()
  logp, logq = zs_y - lse_s, zt_y - lse_t
  out = dict(logp=logp, logq=logq, teacher_argmax=t_arg)

  if support == "sampled":
    out["divergence"] = sampled_reverse_kl(logp, logq)
    out["reverse_kl"] = logp - logq
  elif support == "topk":
    lp, lq = with_tail(topk[0] - lse_s[:, None]), with_tail(topk[1] - lse_t[:, None])
    out["divergence"] = pointwise(kind, lp, lq, beta).sum(-1)
    out["reverse_kl"] = pointwise("reverse_kl", lp, lq).sum(-1)
  else:

    def second_pass(carry, logits, cols, valid):
      del cols
      lp, lq = logits[0] - lse_s[:, None], logits[1] - lse_t[:, None]
      div = jnp.where(valid, pointwise(kind, lp, lq, beta), 0.0).sum(-1)
      rkl = jnp.where(valid, pointwise("reverse_kl", lp, lq), 0.0).sum(-1)
      return carry[0] + div, carry[1] + rkl

    div, rkl = vocab_chunks.scan_vocab(
      second_pass, (jnp.zeros(n), jnp.zeros(n)), (student, teacher), chunk_size
    )
    out["divergence"], out["reverse_kl"] = div, rkl
  return out
