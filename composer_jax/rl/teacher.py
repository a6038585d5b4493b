"""Teacher contexts for self-distillation with targeted text feedback.

For a trajectory and a target model turn k with hint tokens h (e.g. "Reminder: the available
tools are ..."), the teacher reads

    teacher stream = stream[:start_k] + h + stream[start_k:end_k]

with positions recomputed from 0, so the same model conditioned on the hint gives the teacher
distribution for every token of turn k (SDPO, arXiv 2601.20802; the Composer 2.5 report). Each
target gets its own teacher row, so several turns of one trajectory, each with its own hint, sit in
one static-shape batch.

Alignment: the model tokens of turn k are listed in "slots" `[T, Lk]` in stream order. Slot j of
teacher row t is the j-th sampled token of the turn; `slot_student_pos` is the position in student
row `student_row[t]` whose logits predict it and `slot_teacher_pos` the teacher position that
predicts the same token. `check_alignment` verifies the two targets are identical.

Over-long teacher sequences (`overflow`):
  * 'error' (default): raise, naming the lengths.
  * 'truncate_prefix': drop the oldest context tokens *after the first turn* (the system prompt,
    which holds the task and tool list, is kept whole) until the teacher stream fits. If dropping
    all of turns 1..k-1 is not enough, raise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from composer_jax.rl.trajectory import Trajectory, bucket_length

OVERFLOW_MODES = ("error", "truncate_prefix")


@dataclasses.dataclass(frozen=True)
class DistillTarget:
  """Distill turn `turn` of trajectory `trajectory_index` (= its student batch row) with `hint`."""

  trajectory_index: int
  turn: int
  hint: Sequence[int]


def _teacher_stream(traj: Trajectory, target: DistillTarget, max_len: int, overflow: str):
  """Returns (teacher token stream, stream offset of turn k in it, number of dropped tokens)."""
  k = target.turn
  start, end = traj.turn_span(k)
  if not traj.is_model_turn(k):
    raise ValueError(
      f"target turn {k} of trajectory {target.trajectory_index} is an environment turn; "
      "only model turns (with sampled tokens) can be distilled"
    )
  hint = np.asarray(target.hint, np.int32)
  n = start + len(hint) + (end - start)
  keep = traj.turn_span(0)[1] if k > 0 else 0  # the first (system) turn is always kept whole
  dropped = 0
  if n > max_len:
    where = (
      f"teacher sequence for trajectory {target.trajectory_index} turn {k} has {n} tokens "
      f"(prefix {start} + hint {len(hint)} + turn {end - start}) > max_len {max_len}"
    )
    if overflow == "error":
      raise ValueError(f"{where}; shorten the hint or use overflow='truncate_prefix'")
    dropped = n - max_len
    if dropped > start - keep:
      raise ValueError(f"{where}; dropping all of turns 1..{k - 1} is not enough")
  prefix = np.concatenate([traj.tokens[:keep], traj.tokens[keep + dropped : start]])
  stream = np.concatenate([prefix, hint, traj.tokens[start:end]]).astype(np.int32)
  return stream, len(prefix) + len(hint), dropped


def build_teacher_batch(
  trajectories: Sequence[Trajectory],
  student_batch: dict[str, np.ndarray],
  targets: Sequence[DistillTarget],
  *,
  buckets: Sequence[int],
  turn_buckets: Sequence[int],
  num_rows: int | None = None,
  max_len: int | None = None,
  overflow: str = "error",
  pad_id: int = 0,
) -> dict[str, np.ndarray]:
  """Builds the teacher batch for `targets` against `student_batch` (from `pack_batch`).

  Args:
    trajectories: the trajectories packed, in order, into `student_batch`.
    student_batch: output of `pack_batch(trajectories, ...)`.
    targets: one entry per (trajectory, target turn, hint).
    buckets: allowed teacher lengths Lt.
    turn_buckets: allowed slot counts Lk (model tokens per target turn).
    num_rows: pad to this many teacher rows T (padding rows have an all-zero slot_mask).
    max_len: longest teacher stream allowed (default: the largest bucket).
    overflow: 'error' or 'truncate_prefix' (see module docstring).
    pad_id: token id written into padding.

  Returns:
    tokens, targets, positions, segment_ids: int32 [T, Lt] (teacher inputs, like `pack_batch`);
    student_row, target_turn, dropped_tokens: int32 [T]; slot_student_pos, slot_teacher_pos,
    slot_target: int32 [T, Lk]; slot_mask: float32 [T, Lk].
  """
  if overflow not in OVERFLOW_MODES:
    raise ValueError(f"overflow={overflow!r}; valid: {OVERFLOW_MODES}")
  if not targets:
    raise ValueError("build_teacher_batch needs at least one target")
  rows = len(targets) if num_rows is None else num_rows
  if rows < len(targets):
    raise ValueError(f"num_rows {num_rows} < number of targets {len(targets)}")
  max_len = max(buckets) if max_len is None else max_len
  built = []
  for target in targets:
    if not 0 <= target.trajectory_index < len(trajectories):
      raise ValueError(
        f"trajectory_index {target.trajectory_index} not in [0, {len(trajectories)})"
      )
    traj = trajectories[target.trajectory_index]
    stream, offset, dropped = _teacher_stream(traj, target, max_len, overflow)
    start, end = traj.turn_span(target.turn)
    sampled = start + np.flatnonzero(traj.model_mask[start:end])  # stream indices, >= 1
    built.append((target, stream, sampled, sampled - start + offset, dropped))
  length = bucket_length(max(len(b[1]) for b in built), buckets)
  slots = bucket_length(max(len(b[2]) for b in built), turn_buckets)
  out = dict(
    tokens=np.full((rows, length), pad_id, np.int32),
    targets=np.full((rows, length), pad_id, np.int32),
    positions=np.zeros((rows, length), np.int32),
    segment_ids=np.zeros((rows, length), np.int32),
    student_row=np.zeros((rows,), np.int32),
    target_turn=np.full((rows,), -1, np.int32),
    dropped_tokens=np.zeros((rows,), np.int32),
    slot_student_pos=np.zeros((rows, slots), np.int32),
    slot_teacher_pos=np.zeros((rows, slots), np.int32),
    slot_target=np.full((rows, slots), pad_id, np.int32),
    slot_mask=np.zeros((rows, slots), np.float32),
  )
  for t, (target, stream, student_idx, teacher_idx, dropped) in enumerate(built):
    n, m = len(stream), len(student_idx)
    out["tokens"][t, :n] = stream
    out["targets"][t, : n - 1] = stream[1:]
    out["positions"][t, :n] = np.arange(n)
    out["segment_ids"][t, :n] = 1
    out["student_row"][t] = target.trajectory_index
    out["target_turn"][t] = target.turn
    out["dropped_tokens"][t] = dropped
    # The logits at position i predict the token at stream index i + 1.
    out["slot_student_pos"][t, :m] = student_idx - 1
    out["slot_teacher_pos"][t, :m] = teacher_idx - 1
    out["slot_target"][t, :m] = stream[teacher_idx]
    out["slot_mask"][t, :m] = 1.0
  check_alignment(student_batch, out)
  return out


def check_alignment(student_batch: dict[str, np.ndarray], teacher_batch: dict[str, np.ndarray]):
  """Raises ValueError unless every slot names the same sampled token in student and teacher."""
  mask = np.asarray(teacher_batch["slot_mask"]) > 0
  rows = np.broadcast_to(np.asarray(teacher_batch["student_row"])[:, None], mask.shape)
  s_pos = np.asarray(teacher_batch["slot_student_pos"])
  t_pos = np.asarray(teacher_batch["slot_teacher_pos"])
  s_tok = np.asarray(student_batch["targets"])[rows, s_pos]
  t_tok = np.take_along_axis(np.asarray(teacher_batch["targets"]), t_pos, axis=1)
  slot_tok = np.asarray(teacher_batch["slot_target"])
  is_model = np.asarray(student_batch["model_mask"])[rows, s_pos] > 0
  bad = mask & ((s_tok != t_tok) | (s_tok != slot_tok) | ~is_model)
  if bad.any():
    t, j = (int(i) for i in np.argwhere(bad)[0])
    raise ValueError(
      f"teacher row {t} slot {j}: student row {rows[t, j]} position {s_pos[t, j]} predicts token "
      f"{s_tok[t, j]} (model token: {bool(is_model[t, j])}) but teacher position {t_pos[t, j]} "
      f"predicts {t_tok[t, j]} (slot_target {slot_tok[t, j]}); {int(bad.sum())} slots misaligned"
    )
