"""A graded patch is reused: the same task, limits and diff are graded once per process
(`agent.episode._grade`); another diff, task or limits is graded afresh."""

import dataclasses

from composer_jax.codetasks.sandbox import bwrap, grader
from composer_jax.envs.coding.agent import episode


@dataclasses.dataclass
class _Task:
  id: str


def test_same_patch_is_graded_once(monkeypatch):
  calls = []

  def grade(task, diff, limits):
    calls.append((task.id, diff))
    return grader.Grade(
      float(len(calls)), 0.0, {}, "", [], {}, 0.0
    )  # a new grade each time it really runs

  monkeypatch.setattr(grader, "grade", grade)
  monkeypatch.setattr(episode, "_GRADES", type(episode._GRADES)())
  a, b = _Task("a"), _Task("b")
  first, cached = episode._grade(a, "diff 1", bwrap.DEFAULT_LIMITS)
  assert not cached and first.reward == 1.0
  again, cached = episode._grade(a, "diff 1", bwrap.DEFAULT_LIMITS)
  assert cached and again is first and len(calls) == 1
  episode._grade(a, "diff 2", bwrap.DEFAULT_LIMITS)
  episode._grade(b, "diff 1", bwrap.DEFAULT_LIMITS)
  episode._grade(a, "diff 1", dataclasses.replace(bwrap.DEFAULT_LIMITS, cpu_s=1))
  assert calls == [("a", "diff 1"), ("a", "diff 2"), ("b", "diff 1"), ("a", "diff 1")]


def test_the_cache_is_bounded(monkeypatch):
  monkeypatch.setattr(
    grader, "grade", lambda task, diff, limits: grader.Grade(0.0, 0.0, {}, "", [], {}, 0.0)
  )
  monkeypatch.setattr(episode, "_GRADES", type(episode._GRADES)())
  monkeypatch.setattr(episode, "_GRADES_KEPT", 3)
  for i in range(5):
    episode._grade(_Task("a"), f"diff {i}", bwrap.DEFAULT_LIMITS)
  assert len(episode._GRADES) == 3
  assert episode._grade(_Task("a"), "diff 4", bwrap.DEFAULT_LIMITS)[1]  # newest kept
  assert not episode._grade(_Task("a"), "diff 0", bwrap.DEFAULT_LIMITS)[1]  # oldest dropped
