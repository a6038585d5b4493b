"""Smoke test of the text-feedback sweep and its figure: the whole pipeline at toy size
(`experiments.tool_feedback.sweep` runs, `experiments.figures.text_feedback` plots), outputs
checked, and a sweep that stopped resumes where it stopped."""

import csv
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def _rows(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def _module(name, *args):
  return subprocess.run(
    [sys.executable, "-m", name, *args],
    check=True,
    cwd=ROOT,
    timeout=900,
    capture_output=True,
    text=True,
  )


def _figure(workdir):
  """(the sweep's stderr, the figure's stdout)."""
  sweep = _module(
    "experiments.tool_feedback.sweep",
    f"--workdir={workdir}",
    "--smoke",
    "--seeds=2",
    "--arms=sd_live,penalty",
    "--behaviours=verbose",
  )
  assert "plot it: python -m experiments.figures.text_feedback" in sweep.stdout
  plot = _module("experiments.figures.text_feedback", f"--workdir={workdir}", "--smoke")
  return sweep.stderr, plot.stdout


@pytest.mark.slow
def test_smoke_runs_end_to_end_and_resumes(tmp_path):
  _, out = _figure(tmp_path)
  assert (tmp_path / "text_feedback.png").stat().st_size > 10_000
  rows = _rows(tmp_path / "text_feedback.csv")
  # 2 arms x 2 seeds x 2 RL steps (CI: the short-episode behaviour; the notebook test runs the
  # long 'tools' scenario), every step with its episode, loss and probe metrics.
  assert sorted((r["behaviour"], r["arm"], r["seed"], r["step"]) for r in rows) == sorted(
    ("verbose", a, str(s), str(t))
    for a in ("sd_live", "penalty")
    for s in range(2)
    for t in range(2)
  )
  for r in rows:
    rate = r["unavailable_rate"] if r["behaviour"] == "tools" else r["verbose_rate"]
    assert 0 <= float(rate) <= 1 and 0 <= float(r["reward"]) <= 1
    for k in (
      "loss",
      "probe_kl",
      "probe_p_good",
      "probe_p_good_hint",
      "rl_grad_norm",
      "teacher_gap_rows",
    ):
      assert np.isfinite(float(r[k])), k
    assert float(r["probe_kl"]) >= 0
  sd = [r for r in rows if r["arm"] == "sd_live"]
  assert all(r["sd_loss"] != "" and np.isfinite(float(r["rl_sd_grad_cos"])) for r in sd)
  assert all(float(r["penalized_tokens"]) >= 0 for r in rows if r["arm"] == "penalty")
  assert all(float(r["sd_grad_norm"]) == 0 for r in rows if r["arm"] == "penalty")
  # The summary: mean and 95% t-interval over seeds of the per-step rows.
  for s in _rows(tmp_path / "text_feedback_summary.csv"):
    v = [
      float(r["reward"])
      for r in rows
      if (r["behaviour"], r["arm"], r["step"]) == (s["behaviour"], s["arm"], s["step"])
    ]
    half = stats.t.ppf(0.975, 1) * np.std(v, ddof=1) / np.sqrt(2)
    assert float(s["reward_mean"]) == pytest.approx(np.mean(v))
    assert float(s["reward_hi"]) == pytest.approx(np.mean(v) + half)
  # Per arm: the last --final_window steps' mean, then the whole run's (both smoke steps).
  assert out.count("verbose sd_live:") == 2
  assert out.count("verbose probe_kl sd_live - penalty") == 2
  assert "mean of all 2 steps" in out

  # Each arm is a run of its own (rl.run in <workdir>/<behaviour>/seed<k>/<arm>): one that
  # stopped after step 1 (its step-2 checkpoint and record gone) runs step 2 again, the same.
  arm = tmp_path / "verbose" / "seed1" / "penalty"
  assert sorted(os.listdir(tmp_path / "verbose" / "seed1")) == ["penalty", "sd_live", "warmup"]
  shutil.rmtree(arm / "checkpoints" / "2")
  lines = (arm / "metrics.jsonl").read_text().splitlines(keepends=True)
  (arm / "metrics.jsonl").write_text(lines[0])
  log, _ = _figure(tmp_path)
  assert log.count("nothing to do") == 3 and "Resuming from" in log  # 3 runs were complete
  again = _rows(tmp_path / "text_feedback.csv")
  timing = lambda r: {k: v for k, v in r.items() if "seconds" not in k}
  assert [timing(r) for r in again] == [timing(r) for r in rows]


def test_interval_smoothing_and_final_numbers_by_hand():
  from experiments.figures import text_feedback as fig

  assert fig.interval([1.0, 3.0]) == pytest.approx((2.0, 12.7062047))  # t(0.975, 1) sd/sqrt(2)
  assert fig.interval([0.5]) == (0.5, 0.0)
  rows = [
    dict(behaviour="tools", arm=arm, seed=seed, step=step, reward=r, unavailable_rate=u, probe_kl=k)
    for arm, seed, step, r, u, k in [
      ("rl", 0, 0, 0.0, 1.0, 2.0),
      ("rl", 0, 1, 1.0, 0.5, 1.0),
      ("rl", 0, 2, 0.5, 0.0, 1.0),
      ("rl", 1, 0, 1.0, 0.0, 2.0),
      ("rl", 1, 1, 0.0, 0.5, 2.0),
      ("rl", 1, 2, 0.5, 1.0, 2.0),
      ("sd", 0, 0, 0.2, 0.4, 1.0),
      ("sd", 0, 1, 0.2, 0.4, 1.0),
      ("sd", 0, 2, 0.2, 0.4, 1.0),
      ("sd", 1, 0, 0.4, 0.2, 1.0),
      ("sd", 1, 1, 0.4, 0.2, 1.0),
      ("sd", 1, 2, 0.4, 0.2, 1.0),
    ]
  ]
  summary = {(s["arm"], s["step"]): s for s in fig.summarize(rows)}
  assert summary["rl", 1]["reward_mean"] == 0.5 and summary["rl", 1]["seeds"] == 2
  assert summary["rl", 1]["reward_hi"] == pytest.approx(
    0.5 + 12.7062047 * np.sqrt(0.5) / np.sqrt(2)
  )
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


def test_teacher_arms_are_configs_compared_by_seed():
  from experiments.configs import rl_tool_feedback
  from experiments.figures import text_feedback as fig

  live, both = (
    rl_tool_feedback.get_config("sd_live"),
    rl_tool_feedback.get_config("both_frozen,behaviour=verbose"),
  )
  assert (live.loss.teacher, live.loss.sd_coef, live.loss.turn_penalty) == ("live", 1.0, 0.0)
  assert (both.loss.teacher, both.loss.turn_penalty, both.behaviour) == ("frozen", 1.0, "verbose")
  assert fig.arm_label("sd_ema") == "RL + targeted SD (ema teacher)"
  with pytest.raises(ValueError, match=r"arm='sd_old'.*'live', 'ema', 'frozen'"):
    rl_tool_feedback.get_config("sd_old")
  final = {
    ("tools", arm): {c: {0: r, 1: r + s} for c in fig.CURVES}
    for arm, r, s in [("rl", 0.5, 0.1), ("sd_frozen", 0.25, 0.0), ("sd_live", 0.75, 0.2)]
  }
  diffs = {name: (m, h) for _, c, name, m, h in fig.comparisons(final) if c == "reward"}
  # Every SD arm against RL, and the report's teacher against the frozen ablation (paired:
  # seed 0 0.75 - 0.25, seed 1 0.95 - 0.25).
  assert sorted(diffs) == ["sd_frozen - rl", "sd_live - rl", "sd_live - sd_frozen"]
  assert diffs["sd_live - sd_frozen"] == pytest.approx(fig.interval([0.5, 0.7]))


def test_merge_concatenates_split_runs_and_rejects_overlaps(tmp_path):
  from experiments.figures import text_feedback as fig

  header = "behaviour,arm,seed,step,reward\n"
  parts = {
    "a": "tools,sd,0,0,0.5\ntools,sd,0,1,0.25\n",
    "b": "tools,sd,1,0,1.0\n",
    "c": "tools,sd,1,0,0.0\n",
  }
  for name, body in parts.items():
    (tmp_path / name).write_text(header + body)
  rows = fig.merge_rows([str(tmp_path / "a"), str(tmp_path / "b")])
  assert [(r["seed"], r["step"], r["reward"]) for r in rows] == [
    (0, 0, 0.5),
    (0, 1, 0.25),
    (1, 0, 1.0),
  ]
  with pytest.raises(ValueError, match=r"\('tools', 'sd', 1, 0\) is in both .*b and .*c"):
    fig.merge_rows([str(tmp_path / n) for n in "abc"])


def test_variant_arms_and_the_sd_coef_sweep():
  from experiments.configs import rl_tool_feedback
  from experiments.figures import text_feedback as fig
  from experiments.tool_feedback import arms

  sdpo, rlvr, lr0 = (rl_tool_feedback.get_config(a) for a in ("sd_sdpo", "sd_rlvr@0.3", "lr0"))
  assert (sdpo.loss.sd_variant, sdpo.loss.divergence, sdpo.loss.support) == ("sdpo", "jsd", "topk")
  assert (sdpo.loss.ema_rate, sdpo.loss.sd_is_clip, sdpo.loss.teacher) == (0.05, 2.0, "ema")
  assert sdpo.rl.teacher_seq_len == 176 + sdpo.loss.sd_demo_tokens
  assert (rlvr.loss.sd_variant, rlvr.loss.sd_coef) == ("rlvr", 0.3)
  assert (lr0.optim.adam_lr, lr0.loss.sd_coef) == (0.0, 0.0)
  assert rl_tool_feedback.get_config("sd").loss.sd_normalization == "batch_tokens"
  assert fig.arm_label("sd_sdpo_live@0.3") == "RL + targeted SD (sdpo, live teacher, sd_coef 0.3)"
  assert arms.expand_arms(["lr0", "rl", "sd_hint", "both"], ["0.1", "1"]) == [
    "lr0",
    "rl",
    "sd_hint@0.1",
    "sd_hint@1",
    "both@0.1",
    "both@1",
  ]
  for bad in ("sd_opsd", "sd_hint@x", "sd@-1"):
    with pytest.raises(ValueError, match="KIND\\[_VARIANT\\]\\[_TEACHER\\]\\[@SD_COEF\\]"):
      rl_tool_feedback.split_arm(bad)
