"""The coding-agent result: OUT/summary.json and OUT/coding_agent.png from the output
directory of `experiments.coding.learn`.

    python -m experiments.figures.coding_agent --workdir=OUT   # (learn does this itself)

Reads, per seed S: the chosen warm-up (`seedS/warmup_choice.json`) and its curve
(`seedS/warmup_curve.jsonl`); per arm the held-out evals `seedS/eval_ARM_{greedy,sampled}/
eval.json` (for the arm `warmup`, if it has none: the curve's evals at the chosen step);
per RL arm `seedS/ARM/metrics.jsonl` (the RL probes). Writes, under "arms", per arm
`{"pass1", "ci95", "seeds", "tasks"}` (greedy held-out pass@1, 95% paired bootstrap interval
over tasks and seeds: `intervals.paired_bootstrap`), under "vs_warmup" the paired difference
of each arm to the warm-up in the same form, and per arm "pass1_sampled" and "passk" (T=1,
k = the sampled evals' episodes a task), "behaviour" (greedy held-out episodes: malformed
turns, tool errors, turns, critical monitor flags per episode, submitted fraction) and "rl"
(per RL step, mean over seeds: reward, entropy, flagged turns, importance weight, seconds).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
from absl import app, flags

from composer_jax.host import files
from experiments.figures.intervals import paired_bootstrap

FIGURE = "coding_agent.png"
SPLITS = ("train", "val", "heldout")
BEHAVIOUR = ("malformed_turns", "tool_errors", "turns", "critical_flags", "submitted")
RL_KEYS = (
  "reward",
  "entropy",
  "flagged_turns",
  "malformed_per_episode",
  "critical_flag_rate",
  "is_weight_mean",
  "is_weight_max",
  "tasks_distinct",
  "grade_cache_hits",
  "sampler/seconds",  # the step's sampling, tool calls and grading
  "env_s",  # of which tool calls and grading
  "grading_s_total",  # of which grading
  "seconds",  # the whole step on the host (sampling + dispatching the update)
)


def _episodes(eval_dir: Path) -> list[dict]:
  with open(eval_dir / "eval.json") as f:
    return json.load(f)["episodes"]


def read_jsonl(path: Path) -> list[dict]:
  return [json.loads(line) for line in _lines(path)] if path.exists() else []


def split_ids(files: dict) -> dict[str, list[str]]:
  """Split -> the ids of its tasks (the `id` of each JSONL record), in file order."""
  return {s: [json.loads(line)["id"] for line in _lines(files[s])] for s in SPLITS}


def _lines(path: Path) -> list[str]:
  return [line for line in Path(path).read_text().splitlines() if line.strip()]


def split_pass1(prefix: Path, files: dict) -> dict[str, float]:
  """pass@1 per split of the evals `PREFIX_greedy` and `PREFIX_sampled`."""
  out = {}
  for name, ids in split_ids(files).items():
    for mode in ("greedy", "sampled"):
      rows = [e for e in _episodes(Path(f"{prefix}_{mode}")) if e["task"] in set(ids)]
      out[f"{name}_{mode}"] = float(np.mean([e["passed"] for e in rows])) if rows else None
  return out


def describe_point(p: dict) -> str:
  fmt = lambda v: "n/a" if v is None else f"{v:.2f}"
  return ", ".join(f"{k} {fmt(p.get(k))}" for k in p if k != "step")


def _per_task(episodes: list[dict], ids: list[str]) -> np.ndarray:
  """[tasks, samples] passed (0/1) in the order of `ids`."""
  by: dict[str, list[float]] = {i: [] for i in ids}
  for e in episodes:
    if e["task"] in by:
      by[e["task"]].append(float(e["passed"]))
  return np.array([by[i] for i in ids])


def _eval_dir(root: Path, arm: str, mode: str) -> Path:
  """The held-out eval of `arm`; for the warm-up, its own or (when the curve's evals hold
  every held-out task) the curve's at the chosen step."""
  if arm == "warmup" and not (root / f"eval_warmup_{mode}").exists():
    step = json.loads((root / "warmup_choice.json").read_text())["step"]
    return root / "curve" / f"step{step}_{mode}"
  return root / f"eval_{arm}_{mode}"


def write_summary(out: Path, files: dict, arms: list[str], k: int) -> dict:
  """OUT/summary.json and OUT/coding_agent.png (module docstring); returns the summary."""
  held = split_ids(files)["heldout"]
  seeds = sorted(int(p.name[4:]) for p in out.glob("seed*") if (p / "warmup_choice.json").exists())
  greedy, sampled, behaviour, rl = {}, {}, {}, {}
  for arm in arms:
    g, s, b = [], [], []
    for seed in seeds:
      root = out / f"seed{seed}"
      eps = [e for e in _episodes(_eval_dir(root, arm, "greedy")) if e["task"] in set(held)]
      g.append(_per_task(eps, held)[:, 0])
      s.append(_per_task(_episodes(_eval_dir(root, arm, "sampled")), held))
      b.append({key: float(np.mean([float(e[key]) for e in eps])) for key in BEHAVIOUR})
    greedy[arm], sampled[arm] = np.stack(g), np.stack(s)
    behaviour[arm] = {key: float(np.mean([x[key] for x in b])) for key in BEHAVIOUR}
    if arm != "warmup":
      rl[arm] = _rl_curve(
        [read_jsonl(out / f"seed{seed}" / arm / "metrics.jsonl") for seed in seeds]
      )
  arms_ci, diffs = paired_bootstrap(greedy, "warmup")
  summary = {
    "tasks_heldout": len(held),
    "seeds": seeds,
    "k": k,
    "arms": arms_ci,
    "vs_warmup": diffs,
    "pass1_sampled": {a: float(v.mean()) for a, v in sampled.items()},
    f"pass{k}": {a: float(v.max(axis=2).mean()) for a, v in sampled.items()},
    "behaviour": behaviour,
    "warmup": {
      f"seed{seed}": {
        "choice": json.loads((out / f"seed{seed}" / "warmup_choice.json").read_text()),
        "curve": read_jsonl(out / f"seed{seed}" / "warmup_curve.jsonl"),
      }
      for seed in seeds
    },
    "rl": rl,
  }
  _write(out / "summary.json", json.dumps(summary, indent=1).encode())
  _write(out / FIGURE, plot(summary))
  return summary


def _write(path: Path, data: bytes) -> None:
  """`data` into `path`, renamed into place when complete (a link at `path` is replaced, at
  the partial file refused: `host.files`)."""
  tmp = f"{path}.partial"
  files.write_bytes(tmp, data)
  os.replace(tmp, path)


def _rl_curve(runs: list[list[dict]]) -> dict[str, list[float]]:
  """Per RL step, the mean over seeds of `RL_KEYS` (None where no seed logged it)."""
  steps = max((len(r) for r in runs), default=0)
  curve = {}
  for key in RL_KEYS:
    values = [[r[i][key] for r in runs if i < len(r) and key in r[i]] for i in range(steps)]
    curve[key] = [float(np.mean(v)) if v else None for v in values]
  return curve


def describe(summary: dict) -> list[str]:
  lines, k = [], summary["k"]
  for arm, s in summary["arms"].items():
    d = summary["vs_warmup"][arm]
    lines.append(
      f"{arm}: held-out pass@1 {s['pass1']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}] "
      f"(vs warm-up {d['pass1']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]), "
      f"pass@{k} {summary[f'pass{k}'][arm]:.3f}, "
      f"{s['seeds']} seeds x {s['tasks']} tasks"
    )
  return lines


def plot(summary: dict) -> bytes:
  """The figure (PNG bytes): pass@1 per arm, the paired differences, the warm-up curves and
  the RL training reward per step."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  arms = list(summary["arms"])
  fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
  x = np.arange(len(arms))
  for ax, key, name in (
    (axes[0], "arms", "held-out pass@1 (greedy), 95% CI"),
    (axes[1], "vs_warmup", "paired difference to warm-up"),
  ):
    rows = [summary[key][a] for a in arms]
    mid = np.array([r["pass1"] for r in rows])
    err = np.abs(np.array([r["ci95"] for r in rows]).T - mid)
    ax.bar(x, mid, yerr=err, capsize=5, color="0.6")
    ax.set_xticks(x, arms)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_title(name, fontsize=10)
  ax = axes[2]
  for seed, w in summary["warmup"].items():
    steps = [p["step"] for p in w["curve"]]
    for split, style in (("val", "-"), ("train", ":"), ("heldout", "--")):
      for mode, color in (("greedy", "tab:blue"), ("sampled", "tab:orange")):
        ys = [p.get(f"{split}_{mode}") for p in w["curve"]]
        ys = [np.nan if y is None else y for y in ys]
        ax.plot(
          steps,
          ys,
          style,
          marker=".",
          color=color,
          label=f"{split} {mode}" if seed == "seed0" else None,
        )
  ax.set_title("warm-up pass@1 vs steps", fontsize=10)
  ax.set_xlabel("warm-up step")
  ax.legend(fontsize=6)
  ax = axes[3]
  for arm, curve in summary["rl"].items():
    ax.plot(np.arange(1, len(curve["reward"]) + 1), curve["reward"], "o-", label=arm)
  ax.set_title("RL training reward (mean over seeds)", fontsize=10)
  ax.set_xlabel("RL step")
  ax.legend(fontsize=7)
  fig.suptitle(
    f"Coding agent, {summary['tasks_heldout']} held-out micro-project tasks, "
    f"{len(summary['seeds'])} seeds",
    fontsize=10,
  )
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=110)
  plt.close(fig)
  return png.getvalue()


def main(argv):
  del argv
  out = Path(_WORKDIR.value)
  if not _WORKDIR.value or not (out / "split").is_dir():
    raise app.UsageError(f"--workdir={_WORKDIR.value!r}: give the --out of a learn run")
  files = {s: out / "split" / f"{s}.jsonl" for s in SPLITS}
  arms = ["warmup"] + sorted({p.name[5:-7] for p in out.glob("seed0/eval_*_greedy") if p.is_dir()})
  meta = json.loads((_eval_dir(out / "seed0", "warmup", "sampled") / "eval.json").read_text())
  for line in describe(write_summary(out, files, arms, int(meta["meta"]["k"]))):
    print(line)


if __name__ == "__main__":
  # Defined only when run as the command: learn and the tests import this module beside other
  # figures, whose flags (`--workdir` too) live in the same absl registry.
  _WORKDIR = flags.DEFINE_string("workdir", "", "experiments.coding.learn's --out")
  app.run(main)
