"""Which weights the self-distillation teacher runs with.

  live:         the current parameters (under stop_gradient in the loss). Tracks the student, and
                in SDPO's experiments eventually drifts/diverges.
  ema:          an exponential moving average of the parameters, ema <- (1 - rate) ema + rate theta
                (rate 0.01-0.05 is stable, SDPO arXiv 2601.20802); `ema_init` / `ema_update`.
  frozen:       the initial parameters.
  trust_region: teacher logits  z = (1 - alpha) z_initial + alpha z_current,  i.e.
                q ∝ q_initial^(1 - alpha) q_current^alpha, the minimizer of
                (1 - alpha) KL(q || q_initial) + alpha KL(q || q_current): a teacher that moves with
                the student but is anchored to the initial model. alpha = 1 is live, 0 frozen.
The loss takes one (hidden, head) pair per variable set from `teacher_variables`, in that order,
and mixes their logits with `mixing_weights`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import ml_collections

TEACHERS = ("live", "ema", "frozen", "trust_region")


class EmaState(NamedTuple):
  """EMA teacher parameters (same tree as the params)."""

  params: Any


def ema_init(params) -> EmaState:
  return EmaState(params)


def ema_update(state: EmaState, params, rate: float) -> EmaState:
  """ema <- ema + rate * (params - ema), leafwise in each leaf's dtype."""
  if not 0.0 < rate <= 1.0:
    raise ValueError(f"ema rate {rate} must be in (0, 1]")
  return EmaState(
    jax.tree.map(
      lambda e, p: (e + rate * (p.astype(e.dtype) - e)).astype(e.dtype), state.params, params
    )
  )


def mixing_weights(cfg: ml_collections.ConfigDict) -> tuple[float, ...]:
  """Logit weights for the variable sets of `teacher_variables`, in the same order."""
  if cfg.teacher not in TEACHERS:
    raise ValueError(f"teacher={cfg.teacher!r}; valid: {TEACHERS}")
  if cfg.teacher != "trust_region":
    return (1.0,)
  alpha = cfg.trust_region_alpha
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"trust_region_alpha={alpha} must be in [0, 1]")
  return (1.0 - alpha, alpha)


def teacher_variables(
  cfg: ml_collections.ConfigDict,
  params,
  *,
  ema: EmaState | None = None,
  initial=None,
) -> tuple:
  """The parameter sets to run the teacher forward with, matching `mixing_weights(cfg)`."""
  mixing_weights(cfg)  # validates cfg.teacher
  need = {"ema": ema, "frozen": initial, "trust_region": initial}
  if cfg.teacher in need and need[cfg.teacher] is None:
    arg = "ema" if cfg.teacher == "ema" else "initial"
    raise ValueError(f"teacher={cfg.teacher!r} needs `{arg}=` parameters")
  return {
    "live": (params,),
    "ema": (ema.params,) if ema is not None else None,
    "frozen": (initial,),
    "trust_region": (initial, params),
  }[cfg.teacher]
