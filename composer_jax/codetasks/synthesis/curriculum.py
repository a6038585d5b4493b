"""Curriculum over a task pool: pass rates from rollouts, filtering, harder variants.

A task with at least `min_rollouts` recorded rewards is 'solved' at rate r = mean(reward == 1).
Tasks never solved (r == 0) or always solved (r == 1) carry no learning signal for group-relative
RL and are retired; tasks solved more often than `easy_rate` are handed to a `harder` callback
(e.g. Generator with n_features + 1 on the same source) whose new tasks join the pool.

With `max_active`, the pool starts from the easiest tasks by their difficulty fields
(difficulty.score: lines to write, features, direct tests, cross-file reach) and admits the
next-easiest waiting task whenever one is retired: the run climbs from easy to hard.
"""

import dataclasses
import json
import random
from collections.abc import Callable
from pathlib import Path

from composer_jax.codetasks.synthesis import difficulty
from composer_jax.codetasks.task import Task


@dataclasses.dataclass
class Stats:
  rollouts: int = 0
  solved: int = 0

  @property
  def rate(self) -> float:
    return self.solved / self.rollouts if self.rollouts else float("nan")


class TaskPool:
  """Active tasks + per-task pass statistics (JSON-serializable)."""

  def __init__(
    self,
    tasks: list[Task],
    *,
    min_rollouts: int = 8,
    easy_rate: float = 0.8,
    max_active: int | None = None,
  ):
    if (
      min_rollouts < 1 or not 0.0 < easy_rate <= 1.0 or (max_active is not None and max_active < 1)
    ):
      raise ValueError(
        f"min_rollouts={min_rollouts} must be >= 1, easy_rate={easy_rate} in (0, 1] and "
        f"max_active={max_active} None or >= 1"
      )
    missing = [t.id for t in tasks if max_active is not None and not t.difficulty]
    if missing:
      raise ValueError(f"max_active needs difficulty fields; tasks {missing[:3]} have none")
    self.tasks = {t.id: t for t in tasks}
    self.stats = {t.id: Stats() for t in tasks}
    self.retired: dict[str, str] = {}
    self.expanded: set[str] = set()
    self.min_rollouts, self.easy_rate, self.max_active = min_rollouts, easy_rate, max_active
    self.admitted: set[str] = set()
    self._admit()

  def _admit(self) -> list[str]:
    """Fills the active set up to max_active with the easiest waiting tasks (all if None)."""
    waiting = [t for t in self.tasks if t not in self.admitted and t not in self.retired]
    if self.max_active is None:
      new = waiting
    else:
      key = lambda t: (difficulty.score(self.tasks[t].difficulty), t)
      new = sorted(waiting, key=key)[: max(0, self.max_active - len(self.active()))]
    self.admitted.update(new)
    return sorted(new)

  def record(self, task_id: str, reward: float) -> None:
    if task_id not in self.stats:
      raise ValueError(f"unknown task id {task_id!r}")
    s = self.stats[task_id]
    s.rollouts += 1
    s.solved += int(reward == 1.0)

  def _measured(self, task_id: str) -> bool:
    return self.stats[task_id].rollouts >= self.min_rollouts

  def active(self) -> list[str]:
    return sorted(t for t in self.admitted if t not in self.retired)

  def sample(self, n: int, seed: int) -> list[str]:
    """n active task ids, uniformly with replacement, deterministic in seed."""
    ids = self.active()
    if not ids:
      raise ValueError("task pool has no active tasks")
    rng = random.Random(seed)
    return [rng.choice(ids) for _ in range(n)]

  def refresh(self, harder: Callable[[Task], list[Task]] | None = None) -> dict:
    """Retires always/never-solved tasks; asks `harder` for variants of too-easy ones (active
    at once); admits the easiest waiting tasks into the places retired ones left."""
    retired, added = [], []
    for tid in self.active():
      if not self._measured(tid):
        continue
      rate = self.stats[tid].rate
      if rate >= self.easy_rate and harder is not None and tid not in self.expanded:
        self.expanded.add(tid)
        for new in harder(self.tasks[tid]):
          if new.id not in self.tasks:
            self.tasks[new.id], self.stats[new.id] = new, Stats()
            self.admitted.add(new.id)
            added.append(new.id)
      if rate in (0.0, 1.0):
        self.retired[tid] = "never solved" if rate == 0.0 else "always solved"
        retired.append(tid)
    return {"retired": retired, "added": added, "admitted": self._admit()}

  def state_dict(self) -> dict:
    """The pool's statistics and sets as JSON-able data (a checkpoint's share)."""
    return {
      "stats": {k: dataclasses.asdict(v) for k, v in self.stats.items()},
      "retired": dict(self.retired),
      "expanded": sorted(self.expanded),
      "admitted": sorted(self.admitted),
    }

  def load_state_dict(self, blob: dict) -> None:
    """Restores `state_dict()` output (entries of unknown tasks are ignored)."""
    for k, v in blob["stats"].items():
      if k in self.stats:
        self.stats[k] = Stats(**v)
    self.retired.update({k: v for k, v in blob["retired"].items() if k in self.tasks})
    self.expanded.update(blob["expanded"])
    self.admitted = {t for t in blob.get("admitted", self.admitted) if t in self.tasks}

  def save(self, path: Path) -> None:
    Path(path).write_text(json.dumps(self.state_dict(), indent=1, sort_keys=True))

  def load(self, path: Path) -> None:
    self.load_state_dict(json.loads(Path(path).read_text()))
