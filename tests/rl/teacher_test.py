"""Tests for composer_jax.rl.teacher: hand-built teacher streams, index maps and errors."""

import functools

import jax
import numpy as np
import pytest

from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig
from composer_jax.rl.teacher import (
  DistillTarget,
  build_teacher_batch,
  check_alignment,
  restrict_to_rows,
  teacher_hidden,
)
from composer_jax.rl.trajectory import Trajectory, Turn, pack_batch
from tests.model.random_variables import random_variables

# system(10 11 12) | model(20 21) | tool(30 31 32) | model(40 41 42) ; hints use ids >= 90
TURNS = [
  Turn([10, 11, 12]),
  Turn([20, 21], [-1, -1]),
  Turn([30, 31, 32]),
  Turn([40, 41, 42], [-1] * 3),
]


def _setup():
  trajs = [Trajectory.from_turns(TURNS, 1.0, 0), Trajectory.from_turns(TURNS[:2], 0.0, 0)]
  return trajs, pack_batch(trajs, buckets=[16])


def _build(targets, **kw):
  trajs, batch = _setup()
  kw = dict(buckets=[8, 16], turn_buckets=[2, 4]) | kw
  return batch, build_teacher_batch(trajs, batch, targets, **kw)


def test_teacher_streams_and_index_map():
  targets = [DistillTarget(0, 3, [90, 91]), DistillTarget(0, 1, [92]), DistillTarget(1, 1, [93])]
  batch, tb = _build(targets, num_rows=4)
  assert tb["tokens"].shape == (4, 16) and tb["slot_mask"].shape == (4, 4)
  expected = [
    [10, 11, 12, 20, 21, 30, 31, 32, 90, 91, 40, 41, 42],
    [10, 11, 12, 92, 20, 21],
    [10, 11, 12, 93, 20, 21],
  ]
  for t, stream in enumerate(expected):
    np.testing.assert_array_equal(tb["tokens"][t, : len(stream)], stream)
    np.testing.assert_array_equal(tb["positions"][t, : len(stream)], np.arange(len(stream)))
    assert tb["segment_ids"][t].sum() == len(stream)
  np.testing.assert_array_equal(tb["student_row"][:3], [0, 0, 1])
  # Turn 3 sits at stream 8..10 in the student; in the teacher it follows the 2-token hint.
  np.testing.assert_array_equal(tb["slot_student_pos"][0, :3], [7, 8, 9])
  np.testing.assert_array_equal(tb["slot_teacher_pos"][0, :3], [9, 10, 11])
  np.testing.assert_array_equal(tb["slot_target"][0, :3], [40, 41, 42])
  np.testing.assert_array_equal(tb["slot_student_pos"][1, :2], [2, 3])
  np.testing.assert_array_equal(tb["slot_teacher_pos"][1, :2], [3, 4])
  np.testing.assert_array_equal(
    tb["slot_mask"], [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0], [0] * 4]
  )
  # The mapped student and teacher targets are the same tokens.
  for t in range(3):
    for j in np.flatnonzero(tb["slot_mask"][t]):
      s = batch["targets"][tb["student_row"][t], tb["slot_student_pos"][t, j]]
      assert s == tb["targets"][t, tb["slot_teacher_pos"][t, j]] == tb["slot_target"][t, j]


def test_misaligned_raises():
  batch, tb = _build([DistillTarget(0, 3, [90])])
  tb["slot_teacher_pos"][0, 1] += 1
  with pytest.raises(ValueError, match="teacher row 0 slot 1: .* misaligned"):
    check_alignment(batch, tb)


def test_env_turn_target_raises():
  with pytest.raises(ValueError, match="target turn 2 of trajectory 0 is an environment turn"):
    _build([DistillTarget(0, 2, [90])])


def test_overlong_hint_raises():
  with pytest.raises(
    ValueError, match=r"has 17 tokens \(prefix 8 \+ hint 6 \+ turn 3\) > max_len 16"
  ):
    _build([DistillTarget(0, 3, [90] * 6)])


def test_truncate_prefix_drops_oldest_after_system_turn():
  _, tb = _build([DistillTarget(0, 3, [90] * 6)], overflow="truncate_prefix")
  # One token too many: the system turn stays, the oldest token after it (20) goes.
  np.testing.assert_array_equal(
    tb["tokens"][0], [10, 11, 12, 21, 30, 31, 32, 90, 90, 90, 90, 90, 90, 40, 41, 42]
  )
  assert tb["dropped_tokens"][0] == 1
  np.testing.assert_array_equal(tb["slot_teacher_pos"][0, :3], [12, 13, 14])
  with pytest.raises(ValueError, match="dropping all of turns 1..2 is not enough"):
    _build([DistillTarget(0, 3, [90] * 11)], overflow="truncate_prefix")


def test_bad_arguments():
  with pytest.raises(ValueError, match="overflow='drop'"):
    _build([DistillTarget(0, 3, [90])], overflow="drop")
  with pytest.raises(ValueError, match="turn 7 out of range"):
    _build([DistillTarget(0, 7, [90])])
  with pytest.raises(ValueError, match="trajectory_index 5"):
    _build([DistillTarget(5, 1, [90])])
  with pytest.raises(ValueError, match="reuse_prefix=True needs overflow='error'"):
    _build([DistillTarget(0, 3, [90])], overflow="truncate_prefix", reuse_prefix=True)


TARGETS = [DistillTarget(0, 3, [90, 91]), DistillTarget(0, 1, []), DistillTarget(1, 1, [93])]


def test_reuse_prefix_rows_hold_only_the_extension():
  batch, tb = _build(TARGETS, num_rows=4, reuse_prefix=True)
  # Row = last prefix token + hint + turn, at positions continuing the student's prefix.
  expected = [([32, 90, 91, 40, 41, 42], 7), ([12, 20, 21], 2), ([12, 93, 20, 21], 2)]
  assert tb["tokens"].shape == (4, 8)
  for t, (ext, first) in enumerate(expected):
    np.testing.assert_array_equal(tb["tokens"][t, : len(ext)], ext)
    np.testing.assert_array_equal(tb["positions"][t], first + np.arange(8))
    assert tb["prefix_len"][t] == first and tb["segment_ids"][t].sum() == len(ext)
  np.testing.assert_array_equal(tb["slot_teacher_pos"][0, :3], [2, 3, 4])
  np.testing.assert_array_equal(tb["slot_teacher_pos"][1, :2], [0, 1])  # empty hint
  np.testing.assert_array_equal(tb["slot_student_pos"][0, :3], [7, 8, 9])


def _reuse_data():
  """Three trajectories of random ids (the second shorter), four flagged turns, two on row 0."""
  rng = np.random.default_rng(0)
  ids = lambda n: rng.integers(1, 90, n).tolist()
  lp = lambda n: [-1.0] * n
  long = [Turn(ids(7)), Turn(ids(4), lp(4)), Turn(ids(5)), Turn(ids(6), lp(6)), Turn(ids(3))]
  trajs = [
    Trajectory.from_turns(long, 1.0, 0),
    Trajectory.from_turns(long[:2], 0.0, 0),
    Trajectory.from_turns(long[:4], 0.0, 0),
  ]
  batch = pack_batch(trajs, buckets=[32])
  targets = [
    DistillTarget(0, 3, ids(5)),
    DistillTarget(0, 1, ids(2)),
    DistillTarget(1, 1, []),
    DistillTarget(2, 3, ids(3)),
  ]
  kw = dict(turn_buckets=[8], num_rows=5)
  full = build_teacher_batch(trajs, batch, targets, buckets=[32], **kw)
  reuse = build_teacher_batch(trajs, batch, targets, buckets=[16], reuse_prefix=True, **kw)
  return batch, full, reuse


@functools.cache
def _teacher_fn(cfg):
  return jax.jit(functools.partial(teacher_hidden, cfg))


@pytest.mark.parametrize("attention", ["mla", "gqa"])
def test_prefix_reuse_equals_full_recompute(attention):
  cfg = ModelConfig(num_layers=2, attention=attention, vocab_size=96, max_position_embeddings=64)
  variables = random_variables(cfg)
  batch, full, reuse = _reuse_data()
  assert reuse["tokens"].shape[1] < full["tokens"].shape[1]
  at_slots = lambda h, tb: np.asarray(h)[np.arange(5)[:, None], tb["slot_teacher_pos"]]
  want = at_slots(_teacher_fn(cfg)(variables, batch, full), full)
  got = at_slots(_teacher_fn(cfg)(variables, batch, reuse), reuse)
  mask = full["slot_mask"] > 0
  np.testing.assert_array_equal(reuse["slot_mask"], full["slot_mask"])
  np.testing.assert_allclose(got[mask], want[mask], rtol=1e-5, atol=1e-5)
  # Any column order of the student rows (e.g. context parallelism's zig-zag): slot = position.
  perm = np.random.default_rng(1).permutation(batch["tokens"].shape[1])
  shuffled = {k: batch[k][:, perm] for k in ("tokens", "positions")}
  got_perm = at_slots(_teacher_fn(cfg)(variables, shuffled, reuse), reuse)
  np.testing.assert_allclose(got_perm[mask], got[mask], rtol=1e-5, atol=1e-5)
  # Logits through the head too (what the SD loss reads).
  head = np.asarray(transformer.output_head(cfg, variables["params"]))
  np.testing.assert_allclose(got[mask] @ head, want[mask] @ head, rtol=1e-5, atol=1e-5)


def test_restrict_to_rows_reindexes_and_masks():
  _, tb = _build(TARGETS, num_rows=4)  # student rows 0, 0, 1 and a padding row
  out = restrict_to_rows(tb, np.array([1, 2]))
  np.testing.assert_array_equal(out["student_row"][2], 0)  # row 1 is minibatch row 0
  np.testing.assert_array_equal(out["slot_mask"][:2], 0.0)  # row 0 is not in the minibatch
  np.testing.assert_array_equal(out["slot_mask"][2], tb["slot_mask"][2])
  out = restrict_to_rows(tb, np.array([3, 0]))
  np.testing.assert_array_equal(out["student_row"][:2], [1, 1])
  np.testing.assert_array_equal(out["slot_mask"][:2], tb["slot_mask"][:2])
  np.testing.assert_array_equal(out["slot_mask"][2], 0.0)
