"""Smoke test of the text-feedback figure: the whole pipeline at toy size, outputs checked."""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def _rows(path):
  with open(path) as f:
    return list(csv.DictReader(f))


@pytest.mark.slow
def test_smoke_runs_end_to_end(tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.figures.text_feedback",
      f"--workdir={tmp_path}",
      "--smoke",
      "--seeds=2",
    ],
    check=True,
    cwd=ROOT,
    timeout=600,
    capture_output=True,
    text=True,
  ).stdout
  assert (tmp_path / "text_feedback.png").stat().st_size > 10_000
  rows = _rows(tmp_path / "text_feedback.csv")
  # 2 arms x 2 seeds x 2 RL steps, every step with its episode and loss metrics.
  assert sorted((r["arm"], r["seed"], r["step"]) for r in rows) == sorted(
    (a, str(s), str(t)) for a in ("rl", "sd") for s in range(2) for t in range(2)
  )
  for r in rows:
    assert 0 <= float(r["unavailable_rate"]) <= 1 and 0 <= float(r["reward"]) <= 1
    assert np.isfinite(float(r["loss"]))
  assert all("sd_loss" in r and r["sd_loss"] != "" for r in rows if r["arm"] == "sd")
  # The summary is the mean / min / max over seeds of the per-step rows.
  summary = _rows(tmp_path / "text_feedback_summary.csv")
  for s in summary:
    v = [float(r["reward"]) for r in rows if (r["arm"], r["step"]) == (s["arm"], s["step"])]
    assert float(s["reward_mean"]) == pytest.approx(np.mean(v))
    assert float(s["reward_min"]) == min(v) and float(s["reward_max"]) == max(v)
  assert out.count("unavailable_rate") == 2


def test_summary_smoothing_and_final_numbers_by_hand():
  from experiments.figures import text_feedback as fig

  rows = [
    dict(arm=arm, seed=seed, step=step, reward=r, unavailable_rate=u)
    for arm, seed, step, r, u in [
      ("rl", 0, 0, 0.0, 1.0), ("rl", 0, 1, 1.0, 0.5), ("rl", 0, 2, 0.5, 0.0),
      ("rl", 1, 0, 1.0, 0.0), ("rl", 1, 1, 0.0, 0.5), ("rl", 1, 2, 0.5, 1.0),
      ("sd", 0, 0, 0.2, 0.4), ("sd", 0, 1, 0.2, 0.4), ("sd", 0, 2, 0.2, 0.4),
    ]
  ]
  summary = {(s["arm"], s["step"]): s for s in fig.summarize(rows)}
  assert summary["rl", 1]["reward_mean"] == 0.5 and summary["rl", 1]["reward_std"] == 0.5
  assert (summary["rl", 0]["unavailable_rate_min"], summary["rl", 0]["unavailable_rate_max"]) == (
    0.0, 1.0)
  assert summary["sd", 2]["seeds"] == 1
  smooth = {(r["arm"], r["seed"], r["step"]): r for r in fig.smoothed(rows, 2)}
  assert smooth["rl", 0, 0]["reward"] == 0.0 and smooth["rl", 0, 2]["reward"] == 0.75
  assert smooth["rl", 1, 2]["unavailable_rate"] == 0.75
  final = fig.final_numbers(rows, 2)
  # Per-seed mean of steps 1..2: seed 0 reward 0.75, seed 1 reward 0.25.
  assert final["rl"]["reward"] == (0.5, 0.25, 0.25, 0.75)
  assert final["sd"]["unavailable_rate"] == pytest.approx((0.4, 0.0, 0.4, 0.4))
