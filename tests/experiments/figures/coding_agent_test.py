"""The coding-agent figure's command (`python -m experiments.figures.coding_agent`) on a
workdir laid out as `experiments.coding.learn` leaves it: per-arm means, 95% t-intervals and
paired differences against the warm-up, computed by hand here."""

import csv
import json
import subprocess
import sys

import pytest

EVAL_KEYS = (
  "malformed_turns_per_episode",
  "tool_errors_per_episode",
  "turns_per_episode",
  "submitted_per_episode",
)


def _eval(path, pass_at_1):
  path.mkdir(parents=True)
  summary = {"episodes": 10, "pass@1": pass_at_1, **dict.fromkeys(EVAL_KEYS, 1.0)}
  (path / "eval.json").write_text(json.dumps({"summary": summary}))


def test_cli_writes_intervals_and_paired_differences(tmp_path):
  work = tmp_path / "learn"
  for seed, (warm, rl) in enumerate([(0.2, 0.4), (0.0, 0.4)]):
    root = work / f"seed{seed}"
    _eval(root / "eval_warmup", warm)
    _eval(root / "eval_rl", rl)
    (root / "warmup").mkdir()
    (root / "warmup" / "metrics.jsonl").write_text(json.dumps({"step": 1, "ce": 0.5}) + "\n")
    (root / "rl").mkdir()
    (root / "rl" / "metrics.jsonl").write_text(
      "".join(json.dumps({"step": s, "reward": r}) + "\n" for s, r in ((1, 0.0), (2, 0.5)))
    )
  out = tmp_path / "results"
  # Its own process, as learn.py runs it (the figure modules each define --workdir).
  subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.figures.coding_agent",
      f"--workdir={work}",
      f"--results_dir={out}",
    ],
    check=True,
  )
  rows = {r["arm"]: r for r in csv.DictReader(open(out / "coding_agent.csv"))}
  assert set(rows) == {"warmup", "rl"} and (out / "coding_agent.png").stat().st_size > 0
  t = 12.7062047  # t(0.975, 1): two seeds
  assert float(rows["warmup"]["pass@1"]) == pytest.approx(0.1)
  assert float(rows["warmup"]["pass@1_ci95"]) == pytest.approx(t * 0.1)  # sd 0.1414 / sqrt 2
  assert float(rows["rl"]["pass@1"]) == pytest.approx(0.4)
  assert float(rows["rl"]["pass@1_ci95"]) == pytest.approx(0.0)
  assert float(rows["rl"]["d_pass@1"]) == pytest.approx(0.3)  # paired: 0.2 and 0.4
  assert float(rows["rl"]["d_pass@1_ci95"]) == pytest.approx(t * 0.1)
  assert float(rows["rl"]["train_reward"]) == pytest.approx(0.25)  # mean over RL steps
