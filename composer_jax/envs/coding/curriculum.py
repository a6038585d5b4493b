"""Curriculum over a task pool: pass rates from rollouts, filtering, harder variants.

A task with at least `min_rollouts` recorded rewards is 'solved' at rate r = mean(reward == 1).
Tasks never solved (r == 0) or always solved (r == 1) carry no learning signal for group-relative
RL and are retired; tasks solved more often than `easy_rate` are handed to a `harder` callback
(e.g. Generator with n_features + 1 on the same source) whose new tasks join the pool.
"""

import dataclasses
import json
import random
from collections.abc import Callable
from pathlib import Path

from composer_jax.envs.coding.task import Task


@dataclasses.dataclass
class Stats:
  rollouts: int = 0
  solved: int = 0

  @property
  def rate(self) -> float:
    return self.solved / self.rollouts if self.rollouts else float("nan")


class TaskPool:
  """Active tasks + per-task pass statistics (JSON-serializable)."""

  def __init__(self, tasks: list[Task], *, min_rollouts: int = 8, easy_rate: float = 0.8):
    if min_rollouts < 1 or not 0.0 < easy_rate <= 1.0:
      raise ValueError(
        f"min_rollouts={min_rollouts} must be >= 1 and easy_rate={easy_rate} in (0, 1]"
      )
    self.tasks = {t.id: t for t in tasks}
    self.stats = {t.id: Stats() for t in tasks}
    self.retired: dict[str, str] = {}
    self.expanded: set[str] = set()
    self.min_rollouts, self.easy_rate = min_rollouts, easy_rate

  def record(self, task_id: str, reward: float) -> None:
    if task_id not in self.stats:
      raise ValueError(f"unknown task id {task_id!r}")
    s = self.stats[task_id]
    s.rollouts += 1
    s.solved += int(reward == 1.0)

  def _measured(self, task_id: str) -> bool:
    return self.stats[task_id].rollouts >= self.min_rollouts

  def active(self) -> list[str]:
    return sorted(t for t in self.tasks if t not in self.retired)

  def sample(self, n: int, seed: int) -> list[str]:
    """n active task ids, uniformly with replacement, deterministic in seed."""
    ids = self.active()
    if not ids:
      raise ValueError("task pool has no active tasks")
    rng = random.Random(seed)
    return [rng.choice(ids) for _ in range(n)]

  def refresh(self, harder: Callable[[Task], list[Task]] | None = None) -> dict:
    """Retires always/never-solved tasks; asks `harder` for variants of too-easy ones."""
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
            added.append(new.id)
      if rate in (0.0, 1.0):
        self.retired[tid] = "never solved" if rate == 0.0 else "always solved"
        retired.append(tid)
    return {"retired": retired, "added": added}

  def save(self, path: Path) -> None:
    Path(path).write_text(
      json.dumps(
        {
          "stats": {k: dataclasses.asdict(v) for k, v in self.stats.items()},
          "retired": self.retired,
          "expanded": sorted(self.expanded),
        },
        indent=1,
        sort_keys=True,
      )
    )

  def load(self, path: Path) -> None:
    blob = json.loads(Path(path).read_text())
    for k, v in blob["stats"].items():
      if k in self.stats:
        self.stats[k] = Stats(**v)
    self.retired.update({k: v for k, v in blob["retired"].items() if k in self.tasks})
    self.expanded.update(blob["expanded"])
