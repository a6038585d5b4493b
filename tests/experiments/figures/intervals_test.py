"""The paired two-level bootstrap of the coding result (`intervals.paired_bootstrap`) against
hand computations: an exact small case, the normal approximation, and the pairing."""

import numpy as np
import pytest

from experiments.figures.intervals import paired_bootstrap


def test_two_tasks_one_seed_by_hand():
  # Resampling 2 tasks of [0, 1]: means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the
  # 2.5% and 97.5% percentiles are 0 and 1.
  arms, diffs = paired_bootstrap({"w": np.array([[0.0, 1.0]]), "r": np.array([[1.0, 1.0]])}, "w")
  assert arms["w"] == {"pass1": 0.5, "ci95": [0.0, 1.0], "seeds": 1, "tasks": 2}
  assert arms["r"]["ci95"] == [1.0, 1.0] and diffs["w"]["ci95"] == [0.0, 0.0]
  assert diffs["r"]["pass1"] == 0.5 and diffs["r"]["ci95"] == [0.0, 1.0]


def test_matches_the_normal_interval_of_a_proportion():
  # One seed, 400 tasks at p = 0.3: the interval is p +- 1.96 sqrt(p (1 - p) / n).
  x = (np.arange(400) % 10 < 3).astype(float)[None]
  arms, _ = paired_bootstrap({"w": x}, "w", n_boot=8000)
  half = 1.96 * np.sqrt(0.3 * 0.7 / 400)
  assert arms["w"]["pass1"] == pytest.approx(0.3)
  assert arms["w"]["ci95"] == pytest.approx([0.3 - half, 0.3 + half], abs=0.006)


def test_paired_differences_are_tighter_than_unpaired():
  # An arm that passes exactly the warm-up's tasks plus 5 of 100: its difference is 0.05 in
  # every draw that keeps the pairing, so the interval is narrow and excludes 0; unpaired
  # intervals of the two arms overlap.
  rng = np.random.default_rng(0)
  base = (rng.random((3, 100)) < 0.4).astype(float)
  better = base.copy()
  better[:, np.flatnonzero(base.max(axis=0) == 0)[:5]] = 1.0  # failed on every seed before
  arms, diffs = paired_bootstrap({"warmup": base, "rl": better}, "warmup")
  lo, hi = diffs["rl"]["ci95"]
  assert 0 < lo <= diffs["rl"]["pass1"] <= hi < 0.15
  assert arms["rl"]["ci95"][0] < arms["warmup"]["ci95"][1]  # the unpaired ones overlap
  assert diffs["rl"]["seeds"] == 3 and diffs["rl"]["tasks"] == 100


def test_seed_level_spread_widens_the_interval():
  # Seeds that disagree (0.2 vs 0.6 on the same tasks) widen the interval beyond the tasks'
  # own spread: the seeds are resampled too.
  tasks = np.tile((np.arange(50) % 5 == 0).astype(float), (2, 1))  # 0.2 on both seeds
  spread = tasks.copy()
  spread[1] = (np.arange(50) % 5 < 3).astype(float)  # 0.6 on seed 1
  narrow, _ = paired_bootstrap({"w": tasks}, "w")
  wide, _ = paired_bootstrap({"w": spread}, "w")
  width = lambda a: a["w"]["ci95"][1] - a["w"]["ci95"][0]
  assert width(wide) > 2 * width(narrow)


def test_mismatched_shapes_are_one_line():
  with pytest.raises(ValueError, match="same \\[seeds, tasks\\]"):
    paired_bootstrap({"w": np.zeros((2, 3)), "r": np.zeros((2, 4))}, "w")
