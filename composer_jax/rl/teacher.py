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

Prefix reuse (`reuse_prefix=True`): the teacher's prefix `stream[:start_k]` is the student's own,
at the same positions, so its keys/values (the MLA latent, `model.kv_cache`) equal the student's.
Then a teacher row holds only its *extension* `stream[start_k - 1] + h + stream[start_k:end_k]` at
positions `start_k - 1, start_k, ...` (continuing the prefix; the one repeated prefix token gives
the logits that predict the turn's first token when the hint is empty), `prefix_len [T]` =
`start_k - 1` says how many cache slots come from the student, and `teacher_hidden` prefills the
student rows once (at `pack_batch`'s positions, slot = position) (shared by every flagged turn of a trajectory) and extends each teacher row
over its cache: the teacher's per-turn cost grows with hint + turn, not with the trajectory.
Slots index the extension (`slot_teacher_pos`), so `losses` is the same in both layouts.

Over-long teacher sequences (`overflow`):
  * 'error' (default): raise, naming the lengths.
  * 'truncate_prefix': drop the oldest context tokens *after the first turn* (the system prompt,
    which holds the task and tool list, is kept whole) until the teacher stream fits. If dropping
    all of turns 1..k-1 is not enough, raise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from composer_jax.model import kv_cache, transformer
from composer_jax.model.config import ModelConfig
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
  reuse_prefix: bool = False,
) -> dict[str, np.ndarray]:
  """Builds the teacher batch for `targets` against `student_batch` (from `pack_batch`).

  Args:
    trajectories: the trajectories packed, in order, into `student_batch`.
    student_batch: output of `pack_batch(trajectories, ...)`.
    targets: one entry per (trajectory, target turn, hint).
    buckets: allowed teacher lengths Lt (with reuse_prefix: extension lengths, 1 + hint + turn).
    turn_buckets: allowed slot counts Lk (model tokens per target turn).
    num_rows: pad to this many teacher rows T (padding rows have an all-zero slot_mask).
    max_len: longest teacher stream allowed (default: the largest bucket; with reuse_prefix the
      student length + the largest bucket).
    overflow: 'error' or 'truncate_prefix' (see module docstring).
    pad_id: token id written into padding.
    reuse_prefix: rows hold only the extension over the student's prefix cache (module
      docstring; for `teacher_hidden`). Needs overflow='error' (a truncated prefix is not the
      student's); max_len then bounds the whole stream prefix + hint + turn.

  Returns:
    tokens, targets, positions, segment_ids: int32 [T, Lt] (teacher inputs, like `pack_batch`);
    student_row, target_turn, dropped_tokens: int32 [T]; slot_student_pos, slot_teacher_pos,
    slot_target: int32 [T, Lk]; slot_mask: float32 [T, Lk]; with reuse_prefix also
    prefix_len: int32 [T] (cache slots taken from the student row; 0 on padding rows).
  """
  if overflow not in OVERFLOW_MODES:
    raise ValueError(f"overflow={overflow!r}; valid: {OVERFLOW_MODES}")
  if reuse_prefix and overflow != "error":
    raise ValueError(
      f"reuse_prefix=True needs overflow='error', got {overflow!r}: a truncated "
      "prefix is not the student's, so its cache cannot be reused"
    )
  if reuse_prefix and max_len is None:
    max_len = int(np.asarray(student_batch["tokens"]).shape[1]) + max(buckets)
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
    first = max(start - 1, 0) if reuse_prefix else 0  # stream index of the row's first token
    built.append(
      (target, stream[first:], sampled, sampled - start + offset - first, first, dropped)
    )
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
  if reuse_prefix:
    out["prefix_len"] = np.zeros((rows,), np.int32)
  for t, (target, stream, student_idx, teacher_idx, first, dropped) in enumerate(built):
    n, m = len(stream), len(student_idx)
    out["tokens"][t, :n] = stream
    out["targets"][t, : n - 1] = stream[1:]
    if reuse_prefix:  # positions continue the prefix, padding included (cache slots past it)
      out["positions"][t] = first + np.arange(length)
      out["prefix_len"][t] = first
    else:
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


def _decode_cfg(cfg: ModelConfig) -> ModelConfig:
  """MoE layers decode dropless (as the sampler): a capacity buffer would make a token's output
  depend on the other tokens of its batch."""
  return cfg.replace(moe_dispatch="dropless") if cfg.moe_dispatch == "capacity" else cfg


def prefill_prefix(
  cfg: ModelConfig,
  variables: dict,
  student_tokens: jax.Array,
  student_positions: jax.Array,
  extension_len: int,
) -> dict:
  """The student rows' cache: `student_tokens [B, L]` at `student_positions [B, L]` (a
  permutation of 0..L-1 per row, padding included, as `pack_batch` gives: so a row's padding
  lands past its prefix, in any row order, e.g. context parallelism's zig-zag) into `L +
  extension_len` slots (`model.kv_cache` layout), stop-gradient. One prefill serves all the
  flagged turns of a trajectory."""
  b, length = student_tokens.shape
  if length + extension_len > cfg.max_position_embeddings:
    raise ValueError(
      f"prefix cache of student length {length} + teacher extension "
      f"{extension_len} exceeds max_position_embeddings="
      f"{cfg.max_position_embeddings}"
    )
  cfg = _decode_cfg(cfg)
  cache = kv_cache.init(cfg, b, length + extension_len)
  _, cache = transformer.decode(
    cfg, jax.lax.stop_gradient(variables), student_tokens, student_positions, cache
  )
  return cache


def extend_teacher(
  cfg: ModelConfig, variables: dict, cache: dict, teacher_batch: dict
) -> jax.Array:
  """Teacher hidden `[T, Lt, D]` of the extension rows over `cache` (from `prefill_prefix`):
  row t reads its student row's cache (`student_row`) and runs only its own tokens."""
  cache = jax.tree.map(lambda c: c[:, teacher_batch["student_row"]], cache)  # [layers, T, S, ..]
  hidden, _ = transformer.decode(
    _decode_cfg(cfg),
    jax.lax.stop_gradient(variables),
    teacher_batch["tokens"],
    teacher_batch["positions"],
    cache,
  )
  return hidden


def teacher_hidden(
  cfg: ModelConfig, variables: dict, student_batch: dict, teacher_batch: dict
) -> jax.Array:
  """Teacher hidden states `[T, Lt, D]` on `teacher_batch['tokens']` (after the final norm).

  Full layout: one forward over each teacher row. Prefix-reuse layout (`prefix_len` present):
  `prefill_prefix` of the student rows once, then `extend_teacher` (absorbed MLA or cached GQA
  decode: equal to the full forward to float rounding).
  """
  if "prefix_len" not in teacher_batch:
    return transformer.forward(
      cfg,
      variables,
      teacher_batch["tokens"],
      teacher_batch["segment_ids"],
      teacher_batch["positions"],
    )[0]
  cache = prefill_prefix(
    cfg,
    variables,
    student_batch["tokens"],
    student_batch["positions"],
    teacher_batch["tokens"].shape[1],
  )
  return extend_teacher(cfg, variables, cache, teacher_batch)


def restrict_to_rows(teacher_batch: dict, rows: jax.Array) -> dict:
  """The teacher batch for a minibatch of student rows `rows [M]` (original row ids, in
  minibatch order): `student_row` re-indexed into the minibatch, slots of teacher rows whose
  student row is not in it masked out (static shape: all T teacher rows stay)."""
  match = teacher_batch["student_row"][:, None] == rows[None, :]  # [T, M]
  present = match.any(axis=-1)
  return dict(
    teacher_batch,
    student_row=jnp.argmax(match, axis=-1).astype(jnp.int32),
    slot_mask=teacher_batch["slot_mask"] * present[:, None],
  )
