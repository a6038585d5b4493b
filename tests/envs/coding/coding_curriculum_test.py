"""Curriculum: pass-rate bookkeeping, retiring, harder variants, persistence."""

import math

import pytest

from composer_jax.envs.coding.curriculum import TaskPool
from composer_jax.envs.coding.task import Task


def _task(tid):
  return Task(
    id=tid,
    source={},
    features=[],
    problem_statement="",
    deletion_diff="",
    gold_patch="",
    workspace="",
    hidden_files="",
    FAIL_TO_PASS=["t"],
    PASS_TO_PASS=["u"],
    provenance={},
  )


def test_refresh_retires_and_expands(tmp_path):
  pool = TaskPool(
    [_task(t) for t in ("easy", "hard", "never", "fresh", "mid")], min_rollouts=4, easy_rate=0.75
  )
  rewards = {
    "easy": [1, 1, 1, 1],
    "hard": [1, 0, 0, 0],
    "never": [0, 0, 0, 0],
    "fresh": [1, 1],
    "mid": [1, 1, 1, 0],
  }
  for tid, rs in rewards.items():
    for r in rs:
      pool.record(tid, float(r))
  assert pool.stats["mid"].rate == 0.75 and math.isnan(TaskPool([_task("z")]).stats["z"].rate)
  asked = []

  def harder(t):
    asked.append(t.id)
    return [_task(t.id + "+1")]

  out = pool.refresh(harder)
  assert out == {"retired": ["easy", "never"], "added": ["easy+1", "mid+1"]}
  assert asked == ["easy", "mid"]
  assert pool.active() == ["easy+1", "fresh", "hard", "mid", "mid+1"]
  assert pool.refresh(harder) == {"retired": [], "added": []}  # each task expanded once
  pool.save(tmp_path / "pool.json")
  again = TaskPool([_task(t) for t in pool.tasks], min_rollouts=4, easy_rate=0.75)
  again.load(tmp_path / "pool.json")
  assert again.active() == pool.active() and again.stats["hard"].solved == 1


def test_sample_is_deterministic_and_errors():
  pool = TaskPool([_task("a"), _task("b")])
  assert pool.sample(5, seed=3) == pool.sample(5, seed=3)
  assert set(pool.sample(50, seed=0)) == {"a", "b"}
  with pytest.raises(ValueError, match="unknown task id"):
    pool.record("zzz", 1.0)
  with pytest.raises(ValueError, match="min_rollouts=0"):
    TaskPool([], min_rollouts=0)
  with pytest.raises(ValueError, match="no active tasks"):
    TaskPool([]).sample(1, seed=0)
