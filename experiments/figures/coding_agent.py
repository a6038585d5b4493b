"""Figure: held-out pass@1 of the coding agent after the warm-up, after RL, after RL + SD.

    python -m experiments.figures.coding_agent --workdir=OUT   # OUT of experiments.coding.learn

Reads, per seed S, `OUT/seedS/eval_{warmup,rl,sd}/eval.json` (greedy episodes on the held-out
tasks: pass@1 and behaviour) and the runs' metrics (`OUT/seedS/warmup/metrics.jsonl`: the
warm-up's last CE and greedy well-formedness check; `OUT/seedS/{rl,sd}/metrics.jsonl`: the RL
steps' training reward, malformed turns and flagged-turn counts, the probes of why RL moves or
not). Writes `OUT/coding_agent_seeds.csv` (one row per seed and arm), and
`coding_agent.csv` (per arm: mean and 95% Student-t half-width over seeds; paired differences
against the warm-up) and `coding_agent.png` in `--results_dir`.
"""

from __future__ import annotations

import csv
import glob
import json
import os

import numpy as np
from absl import app, flags

from experiments.figures.intervals import interval

ARMS = ("warmup", "rl", "sd")
LABELS = {"warmup": "warm-up (SFT)", "rl": "+ RL", "sd": "+ RL + SD"}
EVAL = (
  "pass@1",
  "malformed_turns_per_episode",
  "tool_errors_per_episode",
  "turns_per_episode",
  "submitted_per_episode",
)
TRAIN = ("train_reward", "train_malformed", "warmup_ce", "warmup_check_malformed")


def _jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _last(records: list[dict], key: str) -> float:
  values = [r[key] for r in records if key in r]
  return float(values[-1]) if values else float("nan")


def _mean(records: list[dict], key: str) -> float:
  values = [r[key] for r in records if key in r]
  return float(np.mean(values)) if values else float("nan")


def seed_rows(workdir: str) -> list[dict]:
  """One row per (seed, arm) with an eval.json: the eval summary and the training probes."""
  rows = []
  for seed_dir in sorted(glob.glob(os.path.join(workdir, "seed*"))):
    seed = int(os.path.basename(seed_dir)[4:])
    warm = _jsonl(os.path.join(seed_dir, "warmup", "metrics.jsonl"))
    for arm in ARMS:
      path = os.path.join(seed_dir, f"eval_{arm}", "eval.json")
      if not os.path.exists(path):
        continue
      with open(path) as f:
        summary = json.load(f)["summary"]
      rl = _jsonl(os.path.join(seed_dir, arm, "metrics.jsonl")) if arm != "warmup" else []
      rows.append(
        dict(
          seed=seed,
          arm=arm,
          episodes=summary["episodes"],
          **{k: float(summary[k]) for k in EVAL},
          train_reward=_mean(rl, "reward"),
          train_malformed=_mean(rl, "malformed_per_episode"),
          warmup_ce=_last(warm, "ce"),
          warmup_check_malformed=_last(warm, "check/malformed"),
        )
      )
  return rows


def summarize(rows: list[dict]) -> list[dict]:
  """Per arm: mean and 95% half-width over seeds of every value; `d_pass@1` is the paired
  (same seed) difference to the warm-up."""
  by = {(r["seed"], r["arm"]): r for r in rows}
  out = []
  for arm in ARMS:
    arm_rows = [r for r in rows if r["arm"] == arm]
    if not arm_rows:
      continue
    row = {"arm": arm, "seeds": len(arm_rows)}
    for key in EVAL + TRAIN:
      row[key], row[f"{key}_ci95"] = interval([r[key] for r in arm_rows])
    diffs = [
      r["pass@1"] - by[(r["seed"], "warmup")]["pass@1"]
      for r in arm_rows
      if (r["seed"], "warmup") in by
    ]
    row["d_pass@1"], row["d_pass@1_ci95"] = interval(diffs)
    out.append(row)
  return out


def _write_csv(path: str, rows: list[dict]) -> None:
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)


def plot(path: str, summary: list[dict], rows: list[dict], title: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = (
    ("pass@1", "held-out pass@1 (greedy)"),
    ("malformed_turns_per_episode", "malformed turns / episode"),
    ("tool_errors_per_episode", "tool errors / episode"),
    ("turns_per_episode", "turns / episode"),
  )
  fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
  x = np.arange(len(summary))
  for ax, (key, name) in zip(axes, panels, strict=True):
    ax.bar(
      x,
      [s[key] for s in summary],
      yerr=[s[f"{key}_ci95"] for s in summary],
      capsize=5,
      color=["0.6", "tab:blue", "tab:orange"][: len(summary)],
    )
    for i, s in enumerate(summary):
      seeds = [r[key] for r in rows if r["arm"] == s["arm"]]
      ax.scatter([i] * len(seeds), seeds, color="k", s=10, zorder=3)
    ax.set_xticks(x, [LABELS[s["arm"]] for s in summary])
    ax.set_title(name, fontsize=10)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_outputs(workdir: str, results_dir: str) -> dict:
  rows = seed_rows(workdir)
  if not rows:
    raise ValueError(f"{workdir}: no seed*/eval_*/eval.json; run experiments.coding.learn first")
  summary = summarize(rows)
  os.makedirs(results_dir, exist_ok=True)
  _write_csv(os.path.join(workdir, "coding_agent_seeds.csv"), rows)
  _write_csv(os.path.join(results_dir, "coding_agent.csv"), summary)
  seeds = sorted({r["seed"] for r in rows})
  held = int(rows[0]["episodes"])
  title = (
    f"Coding agent on held-out micro-project tasks ({held} tasks, greedy): mean and 95% "
    f"t-interval over {len(seeds)} seeds (dots: seeds)"
  )
  png = os.path.join(results_dir, "coding_agent.png")
  plot(png, summary, rows, title)
  for s in summary:
    print(
      f"{s['arm']}: pass@1 {s['pass@1']:.3f} ± {s['pass@1_ci95']:.3f} "
      f"(vs warm-up {s['d_pass@1']:+.3f} ± {s['d_pass@1_ci95']:.3f}), malformed/ep "
      f"{s['malformed_turns_per_episode']:.2f}, seeds {s['seeds']}"
    )
  return {"png": png, "summary": summary}


_WORKDIR = flags.DEFINE_string("workdir", None, "experiments.coding.learn's --out", required=True)
_RESULTS = flags.DEFINE_string(
  "results_dir",
  os.path.join(os.path.dirname(__file__), "results"),
  "where the PNG and summary CSV go",
)


def main(argv):
  del argv
  write_outputs(_WORKDIR.value, _RESULTS.value)


if __name__ == "__main__":
  app.run(main)
