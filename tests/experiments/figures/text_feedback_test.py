"""Smoke test of the text-feedback figure: the whole pipeline at toy size, outputs checked."""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def _rows(path):
  with open(path) as f:
    return list(csv.DictReader(f))


@pytest.mark.slow
def test_smoke_runs_end_to_end(tmp_path):
  out = subprocess.run(
    [sys.executable, "-m", "experiments.figures.text_feedback", f"--workdir={tmp_path}",
     "--smoke", "--seeds=2", "--arms=sd,penalty", "--behaviours=verbose"],
    check=True, cwd=ROOT, timeout=900, capture_output=True, text=True,
  ).stdout
  assert (tmp_path / "text_feedback.png").stat().st_size > 10_000
  rows = _rows(tmp_path / "text_feedback.csv")
  # 2 arms x 2 seeds x 2 RL steps (CI: the short-episode behaviour; the notebook test runs the
  # long 'tools' scenario), every step with its episode, loss and probe metrics.
  assert sorted((r["behaviour"], r["arm"], r["seed"], r["step"]) for r in rows) == sorted(
    ("verbose", a, str(s), str(t)) for a in ("sd", "penalty") for s in range(2)
    for t in range(2))
  for r in rows:
    rate = r["unavailable_rate"] if r["behaviour"] == "tools" else r["verbose_rate"]
    assert 0 <= float(rate) <= 1 and 0 <= float(r["reward"]) <= 1
    for k in ("loss", "probe_kl", "probe_p_good", "probe_p_good_hint", "rl_grad_norm"):
      assert np.isfinite(float(r[k])), k
    assert float(r["probe_kl"]) >= 0
  sd = [r for r in rows if r["arm"] == "sd"]
  assert all(r["sd_loss"] != "" and np.isfinite(float(r["rl_sd_grad_cos"])) for r in sd)
  assert all(float(r["penalized_tokens"]) >= 0 for r in rows if r["arm"] == "penalty")
  assert all(float(r["sd_grad_norm"]) == 0 for r in rows if r["arm"] == "penalty")
  # The summary: mean and 95% t-interval over seeds of the per-step rows.
  for s in _rows(tmp_path / "text_feedback_summary.csv"):
    v = [float(r["reward"]) for r in rows
         if (r["behaviour"], r["arm"], r["step"]) == (s["behaviour"], s["arm"], s["step"])]
    half = stats.t.ppf(0.975, 1) * np.std(v, ddof=1) / np.sqrt(2)
    assert float(s["reward_mean"]) == pytest.approx(np.mean(v))
    assert float(s["reward_hi"]) == pytest.approx(np.mean(v) + half)
  # Per arm: the last --final_window steps' mean, then the whole run's (both smoke steps).
  assert out.count("verbose sd:") == 2 and out.count("verbose probe_kl sd - penalty") == 2
  assert "mean of all 2 steps" in out


def test_interval_smoothing_and_final_numbers_by_hand():
  from experiments.figures import text_feedback as fig

  assert fig.interval([1.0, 3.0]) == pytest.approx((2.0, 12.7062047))  # t(0.975, 1) sd/sqrt(2)
  assert fig.interval([0.5]) == (0.5, 0.0)
  rows = [
    dict(behaviour="tools", arm=arm, seed=seed, step=step, reward=r, unavailable_rate=u,
         probe_kl=k)
    for arm, seed, step, r, u, k in [
      ("rl", 0, 0, 0.0, 1.0, 2.0), ("rl", 0, 1, 1.0, 0.5, 1.0), ("rl", 0, 2, 0.5, 0.0, 1.0),
      ("rl", 1, 0, 1.0, 0.0, 2.0), ("rl", 1, 1, 0.0, 0.5, 2.0), ("rl", 1, 2, 0.5, 1.0, 2.0),
      ("sd", 0, 0, 0.2, 0.4, 1.0), ("sd", 0, 1, 0.2, 0.4, 1.0), ("sd", 0, 2, 0.2, 0.4, 1.0),
      ("sd", 1, 0, 0.4, 0.2, 1.0), ("sd", 1, 1, 0.4, 0.2, 1.0), ("sd", 1, 2, 0.4, 0.2, 1.0),
    ]
  ]
  summary = {(s["arm"], s["step"]): s for s in fig.summarize(rows)}
  assert summary["rl", 1]["reward_mean"] == 0.5 and summary["rl", 1]["seeds"] == 2
  assert summary["rl", 1]["reward_hi"] == pytest.approx(0.5 + 12.7062047 * np.sqrt(0.5) /
                                                         np.sqrt(2))
  smooth = {(r["arm"], r["seed"], r["step"]): r for r in fig.smoothed(rows, 2)}
  assert smooth["rl", 0, 0]["reward"] == 0.0 and smooth["rl", 0, 2]["reward"] == 0.75
  assert smooth["rl", 1, 2]["unavailable_rate"] == 0.75
  final = fig.final_numbers(rows, 2)
  # Per-seed means of steps 1..2: rl reward seed 0 0.75, seed 1 0.25; rate 0.25 and 0.75.
  assert final["tools", "rl"]["reward"] == {0: 0.75, 1: 0.25}
  diffs = {(c, name): (m, h) for _, c, name, m, h in fig.comparisons(final)}
  # sd - rl rate, paired: seed 0: 0.4 - 0.25, seed 1: 0.2 - 0.75.
  m, h = diffs["rate", "sd - rl"]
  assert m == pytest.approx(np.mean([0.15, -0.55]))
  assert h == pytest.approx(12.7062047 * np.std([0.15, -0.55], ddof=1) / np.sqrt(2))
