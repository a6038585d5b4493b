"""Curriculum: pass-rate bookkeeping, retiring, harder variants, persistence."""

import math

import pytest

from composer_jax.codetasks.synthesis.curriculum import TaskPool
from composer_jax.codetasks.task import Task


def _task(tid, difficulty=None):
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
    difficulty=difficulty or {},
  )


def _fields(lines, features=1, direct=1, files=1, cross=0):
  return {
    "lines": lines,
    "features": features,
    "direct_f2p": direct,
    "files": files,
    "cross_file": cross,
  }


def test_max_active_climbs_from_easy_to_hard(tmp_path):
  # Scores by hand (difficulty.score): log2(1 + lines) + 2 (features - 1) + log2(1 + direct)
  # + (files - 1 + cross) / 2: a 4 + 1 = 5, b 1 + 2 + 1 = 4, c 4 + 2 = 6, d 1 + 1 + 1.5 = 3.5,
  # e 5 + 1 = 6 (ties broken by id).
  tasks = [
    _task("a", _fields(15)),
    _task("b", _fields(1, features=2, direct=1)),
    _task("c", _fields(15, direct=3)),
    _task("d", _fields(1, files=2, cross=2)),
    _task("e", _fields(31, direct=1)),
  ]
  pool = TaskPool(tasks, min_rollouts=2, max_active=2)
  assert pool.active() == ["b", "d"]
  for r in (1.0, 1.0):
    pool.record("d", r)
  out = pool.refresh()
  assert out == {"retired": ["d"], "added": [], "admitted": ["a"]}
  assert pool.active() == ["a", "b"]
  pool.save(tmp_path / "pool.json")
  again = TaskPool(tasks, min_rollouts=2, max_active=2)
  again.load(tmp_path / "pool.json")
  assert again.active() == ["a", "b"] and again.retired == {"d": "always solved"}
  with pytest.raises(ValueError, match="max_active needs difficulty fields"):
    TaskPool([_task("x")], max_active=1)


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
  assert out == {"retired": ["easy", "never"], "added": ["easy+1", "mid+1"], "admitted": []}
  assert asked == ["easy", "mid"]
  assert pool.active() == ["easy+1", "fresh", "hard", "mid", "mid+1"]
  assert pool.refresh(harder) == {"retired": [], "added": [], "admitted": []}  # expanded once
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
