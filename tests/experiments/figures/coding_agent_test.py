"""The coding-agent result (`python -m experiments.figures.coding_agent --workdir=OUT`) on an
output directory laid out as `experiments.coding.learn` leaves it: pass@1, the paired
differences, pass@k, behaviour and the RL curves computed by hand here; the intervals are
`intervals.paired_bootstrap` of the per-task scores (tested on its own)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from experiments.figures.intervals import paired_bootstrap

HELD = ["h0", "h1", "h2", "h3"]
BEHAVIOUR = dict(malformed_turns=1, tool_errors=0, turns=2, critical_flags=0, submitted=True)


def _eval(path, passed: dict[str, list[bool]]):
  path.mkdir(parents=True)
  episodes = [
    dict(task=t, sample=i, passed=p, **BEHAVIOUR)
    for t, ps in passed.items()
    for i, p in enumerate(ps)
  ]
  (path / "eval.json").write_text(json.dumps({"meta": {"k": 2}, "episodes": episodes}))


def _lines(path, records):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in records))


# seed -> arm -> (greedy passed per held-out task, sampled passed: 2 per task)
RESULTS = {
  0: {
    "warmup": ([1, 0, 0, 0], [[1, 0], [0, 0], [0, 1], [0, 0]]),
    "rl": ([1, 1, 0, 0], [[1, 1], [1, 0], [0, 0], [0, 0]]),
  },
  1: {
    "warmup": ([0, 0, 1, 0], [[0, 0], [0, 0], [1, 1], [0, 0]]),
    "rl": ([0, 1, 1, 1], [[0, 1], [1, 1], [1, 0], [0, 0]]),
  },
}


def test_cli_writes_the_summary_and_figure(tmp_path):
  out = tmp_path / "learn"
  for name, ids in (("train", ["t0", "t1"]), ("val", ["v0"]), ("heldout", HELD)):
    _lines(out / "split" / f"{name}.jsonl", [{"id": i} for i in ids])
  for seed, arms in RESULTS.items():
    root = out / f"seed{seed}"
    root.mkdir(parents=True)
    (root / "warmup_choice.json").write_text(json.dumps({"step": 4, "in_band": True}))
    _lines(root / "warmup_curve.jsonl", [{"step": 4, "val_sampled": 0.5, "val_greedy": 1.0}])
    for arm, (greedy, sampled) in arms.items():
      prefix = root / ("curve/step4" if arm == "warmup" else f"eval_{arm}")
      extra = {"v0": [True], "t0": [False]} if arm == "warmup" else {}  # not held out
      _eval(
        prefix.parent / f"{prefix.name}_greedy",
        {**{t: [bool(g)] for t, g in zip(HELD, greedy)}, **extra},
      )
      _eval(prefix.parent / f"{prefix.name}_sampled", dict(zip(HELD, sampled)))
    _lines(root / "rl" / "metrics.jsonl", [{"step": 1, "reward": 0.1 * (seed + 1)}])
  subprocess.run(
    [sys.executable, "-m", "experiments.figures.coding_agent", f"--workdir={out}"], check=True
  )
  s = json.loads((out / "summary.json").read_text())
  assert (out / "coding_agent.png").stat().st_size > 0
  greedy = {a: np.array([RESULTS[seed][a][0] for seed in (0, 1)], float) for a in ("warmup", "rl")}
  arms, diffs = paired_bootstrap(greedy, "warmup")
  assert s["arms"] == arms and s["vs_warmup"] == diffs
  assert s["arms"]["warmup"]["pass1"] == pytest.approx(2 / 8)  # held-out tasks only
  assert s["arms"]["rl"]["pass1"] == pytest.approx(5 / 8)
  assert s["vs_warmup"]["rl"]["pass1"] == pytest.approx(3 / 8)
  assert s["arms"]["rl"]["seeds"] == 2 and s["arms"]["rl"]["tasks"] == 4
  assert s["pass2"]["warmup"] == pytest.approx(3 / 8)  # any of 2 samples: tasks 0, 2 | 2
  assert s["pass1_sampled"]["rl"] == pytest.approx(7 / 16)
  assert s["behaviour"]["rl"]["turns"] == 2.0 and s["behaviour"]["rl"]["submitted"] == 1.0
  assert s["rl"]["rl"]["reward"] == [pytest.approx(0.15)]  # mean over seeds at step 1
  assert s["warmup"]["seed1"]["choice"]["step"] == 4 and s["tasks_heldout"] == 4
