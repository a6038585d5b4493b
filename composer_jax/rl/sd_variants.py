"""Self-distillation variants (`loss.sd_variant`): which flagged turns are distilled, what the
teacher reads before them, and how the teacher enters the objective. One registry entry each:

  hint   the per-turn hint teacher: each flagged turn k is distilled with its hint h before it,
         teacher stream = stream[:start_k] + h + turn k (`rl.teacher`); loss RL + sd_coef * SD,
         SD on the same per-token scale as RL (`loss.sd_normalization` 'batch_tokens').
  sdpo   SDPO's reprompted teacher (arXiv 2601.20802): the context before turn k is extended
         with the environment feedback h *and a successful sibling rollout of the same task* as
         a demonstration (its model turns' tokens, at most `demo_tokens`); only episodes with a
         successful sibling other than themselves are taught (a success is never its own
         teacher); per-token importance-weight clip (`loss.sd_is_clip`). The published settings
         (JSD beta 0.5, top-K + tail, EMA rate 0.05, clip 2) are the `sd_sdpo` arm's config.
  rlvr   self-distilled RLVR: no distillation term; the teacher (with the hint, as 'hint') only
         reweights the RL advantages of the flagged turns' tokens (`losses.advantage_weights`),
         so the reward sets every token's direction and SD cannot push against it.

`distill_targets(variant, targets, trajectories, ...)` turns the environment's flagged turns
(`rl.env.distill_targets`) into the variant's teacher targets on the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from composer_jax.rl.teacher import DistillTarget
from composer_jax.rl.trajectory import Trajectory


@dataclasses.dataclass(frozen=True)
class Variant:
  """`demonstration`: the teacher also reads a successful sibling's turns (only turns with one
  are taught); `distills`: the objective has an SD term (else the teacher reweights RL)."""

  demonstration: bool
  distills: bool


VARIANTS = {
  "hint": Variant(demonstration=False, distills=True),
  "sdpo": Variant(demonstration=True, distills=True),
  "rlvr": Variant(demonstration=False, distills=False),
}


def successes(trajectories: Sequence[Trajectory], threshold: float) -> np.ndarray:
  """[N] bool: the trajectory's reward >= `threshold`."""
  return np.asarray([t.reward >= threshold for t in trajectories], bool)


def sibling_success(
  trajectories: Sequence[Trajectory], index: int, success: np.ndarray
) -> int | None:
  """The first successful trajectory of `index`'s group other than `index` itself, or None."""
  group = trajectories[index].group_id
  for j, t in enumerate(trajectories):
    if j != index and success[j] and t.group_id == group:
      return j
  return None


def model_tokens(traj: Trajectory) -> np.ndarray:
  """The sampled tokens of every model turn of `traj`, in order."""
  return np.asarray(traj.tokens)[np.asarray(traj.model_mask) > 0]


def distill_targets(
  variant: str,
  targets: Sequence[DistillTarget],
  trajectories: Sequence[Trajectory],
  *,
  success_reward: float,
  demo_tokens: int,
) -> list[DistillTarget]:
  """The variant's teacher targets from the flagged turns `targets` (hint per turn): 'hint' and
  'rlvr' keep them; 'sdpo' keeps those with a successful sibling (reward >= `success_reward`)
  and appends that sibling's first `demo_tokens` model tokens to the hint."""
  if variant not in VARIANTS:
    raise ValueError(f"sd_variant={variant!r}; valid: {sorted(VARIANTS)}")
  if not VARIANTS[variant].demonstration:
    return list(targets)
  success = successes(trajectories, success_reward)
  out = []
  for t in targets:
    demo = sibling_success(trajectories, t.trajectory_index, success)
    if demo is not None:
      shown = model_tokens(trajectories[demo])[:demo_tokens]
      out.append(DistillTarget(t.trajectory_index, t.turn, (*t.hint, *shown.tolist())))
  return out
