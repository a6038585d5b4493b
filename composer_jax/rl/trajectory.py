"""Multi-turn trajectories, token-in/token-out, and their packing into static-shape batches.

A trajectory is the flat token stream of one agent episode: system prompt, user message, model
turns, tool calls, tool outputs. The ids are kept exactly as the sampler produced or received them
and are never re-tokenized (chat templates are not append-only, so re-encoding a conversation does
not give back the sampled ids). Every token carries:
  * whether the policy sampled it (`model_mask`; the loss acts only on those),
  * the sampler's log-prob for it (used for the truncated importance weight),
  * the id of the turn it belongs to.
A turn is a *model turn* if it holds at least one sampled token.

Packing (`pack_batch`) shifts for next-token prediction: a trajectory of n tokens fills n
positions, position i reads `tokens[i]` and is scored on `targets[i] = tokens[i + 1]`; every
per-token field (masks, log-probs, turn ids) is aligned with `targets`. The length is padded to the
smallest configured bucket that holds the longest trajectory, so a jitted loss compiles once per
bucket.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Turn:
  """One turn while building a trajectory: `logprobs` given = sampled by the policy."""

  tokens: Sequence[int]
  logprobs: Sequence[float] | None = None


@dataclasses.dataclass(frozen=True)
class Trajectory:
  """One episode. All arrays are `[num_tokens]`, index = position in the token stream.

  Attributes:
    tokens: int32 ids exactly as sampled / received.
    sampler_logprobs: float32 log-prob the sampler assigned to each model token (0 elsewhere).
    model_mask: bool, True where the policy sampled the token.
    turn_ids: int32 turn index of each token, non-decreasing and starting at 0.
    reward: scalar episode reward.
    group_id: id of the prompt group (GRPO: advantages are relative within a group).
  """

  tokens: np.ndarray
  sampler_logprobs: np.ndarray
  model_mask: np.ndarray
  turn_ids: np.ndarray
  reward: float
  group_id: int

  def __post_init__(self):
    fields = dict(
      tokens=np.asarray(self.tokens, np.int32),
      sampler_logprobs=np.asarray(self.sampler_logprobs, np.float32),
      model_mask=np.asarray(self.model_mask, bool),
      turn_ids=np.asarray(self.turn_ids, np.int32),
    )
    for name, value in fields.items():
      object.__setattr__(self, name, value)
    n = fields["tokens"].shape
    if len(n) != 1 or n[0] < 2:
      raise ValueError(f"tokens must be 1-D with >= 2 ids, got shape {n}")
    for name, value in fields.items():
      if value.shape != n:
        raise ValueError(f"{name} has shape {value.shape}, tokens has {n}")
    if self.model_mask[0]:
      raise ValueError("the first token cannot be a model token: nothing precedes it to predict it")
    turns = self.turn_ids
    if turns[0] != 0 or np.any(np.diff(turns) < 0) or np.any(np.diff(turns) > 1):
      raise ValueError(f"turn_ids must start at 0 and step by 0 or 1, got {turns.tolist()}")

  @classmethod
  def from_turns(cls, turns: Sequence[Turn], reward: float, group_id: int) -> Trajectory:
    """Concatenates turns; a turn with `logprobs` is a model turn, one without an env turn."""
    tokens, logprobs, mask, turn_ids = [], [], [], []
    for k, turn in enumerate(turns):
      n = len(turn.tokens)
      if n == 0:
        raise ValueError(f"turn {k} is empty")
      if turn.logprobs is not None and len(turn.logprobs) != n:
        raise ValueError(f"turn {k}: {len(turn.logprobs)} logprobs for {n} tokens")
      tokens.extend(turn.tokens)
      logprobs.extend(turn.logprobs if turn.logprobs is not None else [0.0] * n)
      mask.extend([turn.logprobs is not None] * n)
      turn_ids.extend([k] * n)
    return cls(tokens, logprobs, mask, turn_ids, float(reward), int(group_id))

  @property
  def num_turns(self) -> int:
    return int(self.turn_ids[-1]) + 1

  def turn_span(self, k: int) -> tuple[int, int]:
    """Stream indices `[start, end)` of turn k."""
    if not 0 <= k < self.num_turns:
      raise ValueError(f"turn {k} out of range: trajectory has {self.num_turns} turns")
    idx = np.flatnonzero(self.turn_ids == k)
    return int(idx[0]), int(idx[-1]) + 1

  def is_model_turn(self, k: int) -> bool:
    start, end = self.turn_span(k)
    return bool(self.model_mask[start:end].any())


def bucket_length(n: int, buckets: Sequence[int]) -> int:
  """The smallest bucket >= n (buckets need not be sorted)."""
  fitting = [b for b in buckets if b >= n]
  if not fitting:
    raise ValueError(
      f"length {n} exceeds the largest bucket {max(buckets)}; buckets={list(buckets)}"
    )
  return min(fitting)


def pack_batch(
  trajectories: Sequence[Trajectory],
  buckets: Sequence[int],
  *,
  batch_size: int | None = None,
  pad_id: int = 0,
) -> dict[str, np.ndarray]:
  """Packs trajectories, one per row, into static-shape arrays (L = smallest fitting bucket).

  Args:
    trajectories: the episodes; row b of the batch is `trajectories[b]`.
    buckets: allowed sequence lengths L.
    batch_size: pad the batch to this many rows (padding rows have `valid` 0); default = as many
      rows as trajectories.
    pad_id: token id written into padding.

  Returns:
    tokens, targets, turn_ids (-1 on padding), segment_ids (1 on tokens, 0 on padding), positions
    (0..L-1 on every slot, padding included, so slot = position in any row order: a prefix KV
    cache written at these positions is what `teacher.prefill_prefix` needs): int32 [B, L]; model_mask, sampler_logprobs: float32 [B, L] (aligned with targets); reward,
    valid: float32 [B]; group_index: int32 [B], dense 0..G-1 in order of first appearance (padding
    rows point at group 0 and are invalid).
  """
  if not trajectories:
    raise ValueError("pack_batch needs at least one trajectory")
  rows = len(trajectories) if batch_size is None else batch_size
  if rows < len(trajectories):
    raise ValueError(f"batch_size {batch_size} < number of trajectories {len(trajectories)}")
  length = bucket_length(max(len(t.tokens) for t in trajectories), buckets)
  out = dict(
    tokens=np.full((rows, length), pad_id, np.int32),
    targets=np.full((rows, length), pad_id, np.int32),
    turn_ids=np.full((rows, length), -1, np.int32),
    segment_ids=np.zeros((rows, length), np.int32),
    positions=np.zeros((rows, length), np.int32),
    model_mask=np.zeros((rows, length), np.float32),
    sampler_logprobs=np.zeros((rows, length), np.float32),
    reward=np.zeros((rows,), np.float32),
    valid=np.zeros((rows,), np.float32),
    group_index=np.zeros((rows,), np.int32),
  )
  dense_group: dict[int, int] = {}
  for b, t in enumerate(trajectories):
    n = len(t.tokens)
    out["tokens"][b, :n] = t.tokens
    out["targets"][b, : n - 1] = t.tokens[1:]
    out["turn_ids"][b, : n - 1] = t.turn_ids[1:]
    out["segment_ids"][b, :n] = 1
    out["positions"][b] = np.arange(length)
    out["model_mask"][b, : n - 1] = t.model_mask[1:]
    out["sampler_logprobs"][b, : n - 1] = np.where(t.model_mask[1:], t.sampler_logprobs[1:], 0.0)
    out["reward"][b] = t.reward
    out["valid"][b] = 1.0
    out["group_index"][b] = dense_group.setdefault(t.group_id, len(dense_group))
  return out


def turn_token_mask(batch: dict[str, np.ndarray], turns: Sequence[tuple[int, int]]) -> np.ndarray:
  """float32 [B, L], aligned with `batch['targets']` (`pack_batch`): 1.0 on the sampled tokens of
  each (row, turn index) of `turns` (e.g. the flagged turns, for a per-turn penalty)."""
  out = np.zeros(batch["model_mask"].shape, np.float32)
  for row, turn in turns:
    out[row] = np.where(batch["turn_ids"][row] == turn, batch["model_mask"][row], out[row])
  return out
