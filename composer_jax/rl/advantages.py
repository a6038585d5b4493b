"""Group-relative advantages (GRPO, arXiv 2402.03300 eq. 3; Dr. GRPO, arXiv 2503.20783).

For trajectory i in prompt group g:  A_i = (r_i - mean_g r) / (std_g r + eps)  with std
normalization (GRPO), or  A_i = r_i - mean_g r  without (Dr. GRPO: the std reweights prompts by
difficulty). std is the population std over the group's valid members.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def check_groups(group_index: np.ndarray, valid: np.ndarray, num_groups: int) -> None:
  """Raises ValueError for a group index out of range or a referenced group with no valid member.

  Args:
    group_index: [B] int, the group of each row.
    valid: [B], nonzero for real trajectories.
    num_groups: G, the static number of group slots.
  """
  group_index, valid = np.asarray(group_index), np.asarray(valid) > 0
  bad = (group_index < 0) | (group_index >= num_groups)
  if bad.any():
    raise ValueError(f"group_index {group_index[bad].tolist()} outside [0, {num_groups})")
  counts = np.bincount(group_index[valid], minlength=num_groups)
  empty = sorted(set(group_index.tolist()) - set(np.flatnonzero(counts).tolist()))
  if empty:
    raise ValueError(f"groups {empty} are empty (no valid trajectory); drop them before the loss")


def group_advantages(
  rewards: jax.Array,
  group_index: jax.Array,
  valid: jax.Array,
  *,
  num_groups: int,
  normalize_std: bool,
  eps: float = 1e-6,
) -> jax.Array:
  """Advantages [B] (0 on invalid rows). Jittable; `check_groups` validates inputs eagerly.

  Args:
    rewards: [B] float.
    group_index: [B] int in [0, num_groups).
    valid: [B] float, 1 for real trajectories, 0 for padding rows.
    num_groups: G (static), e.g. the batch size.
    normalize_std: divide by the group std (GRPO) or not (Dr. GRPO).
    eps: added to the std.
  """
  valid = valid.astype(jnp.float32)
  seg = lambda x: jax.ops.segment_sum(x, group_index, num_segments=num_groups)
  count = jnp.maximum(seg(valid), 1.0)
  mean = seg(rewards * valid) / count
  centered = (rewards - mean[group_index]) * valid
  if normalize_std:
    std = jnp.sqrt(seg(centered**2) / count)
    centered = centered / (std[group_index] + eps)
  return centered
