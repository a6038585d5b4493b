"""Figure: calls to unavailable tools and task reward vs RL steps, RL only vs RL + targeted SD.

    python -m experiments.figures.text_feedback --workdir=workdir/text_feedback [--smoke]

For each seed: one supervised warm-up (`experiments.tool_feedback.program.warmup`), then both
arms of `experiments/configs/rl_tool_feedback.py` ('rl': beta = 0, 'sd': beta > 0) from the same
warmed-up weights, with the same tasks, sampling keys and episodes per step. Writes to --workdir:
  text_feedback.csv          one row per (arm, seed, RL step): every metric of the step;
  text_feedback_summary.csv  per (arm, step): mean, std, min, max over seeds of the
                             unavailable-tool call rate and the reward;
  text_feedback.png          both curves per arm: each seed's curve as a trailing --smooth-step
                             moving average, then the mean over seeds with a min-max band;
and prints, per arm, the last `--final_window` steps' mean (over seeds: mean ± std, [min, max]).
--smoke shrinks every size so the whole pipeline runs in seconds (CI); its numbers mean nothing.
--replot redraws the summary, PNG and numbers from an existing text_feedback.csv.
"""

from __future__ import annotations

import csv
import os
import time

import numpy as np
from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Output directory.", required=True)
flags.DEFINE_bool("smoke", False, "Tiny sizes for CI: runs end to end in seconds.")
flags.DEFINE_integer("seeds", 3, "Seeds per arm (each seed: its own warm-up, shared by arms).")
flags.DEFINE_bool("replot", False, "Only redraw the summary and PNG from --workdir's CSV.")
flags.DEFINE_integer("final_window", 10, "Steps averaged for the printed final numbers.")
flags.DEFINE_integer(
  "smooth", 5, "Trailing moving average (steps) of each seed's curve in the plot."
)

ARMS = ("rl", "sd")
LABELS = {"rl": "RL only (β = 0)", "sd": "RL + targeted SD (β = 1)"}
CURVES = (("unavailable_rate", "calls to unavailable tools"), ("reward", "task reward"))
SMOKE = {
  "warmup": dict(steps=2, batch_size=4, log_every=1),
  "train": dict(steps=2, log_every=1),
  "rl": dict(groups=2, group_size=2, teacher_rows=4),
}


def arm_config(arm: str, seed: int, smoke: bool):
  from experiments.configs import rl_tool_feedback

  c = rl_tool_feedback.get_config(arm)
  c.train.seed = seed
  if smoke:
    for section, fields in SMOKE.items():
      c[section].update(fields)
    c.warmup.optim.update(dict(total_steps=c.warmup.steps, warmup_steps=1))
  return c


def smoothed(rows: list[dict], window: int) -> list[dict]:
  """Each (arm, seed) curve replaced by its trailing `window`-step moving average."""
  out = []
  for arm in ARMS:
    for seed in sorted({r["seed"] for r in rows if r["arm"] == arm}):
      run = sorted(
        (r for r in rows if (r["arm"], r["seed"]) == (arm, seed)), key=lambda r: r["step"]
      )
      for i, r in enumerate(run):
        past = run[max(0, i - window + 1) : i + 1]
        out.append(dict(r, **{k: float(np.mean([p[k] for p in past])) for k, _ in CURVES}))
  return out


def summarize(rows: list[dict]) -> list[dict]:
  """Per (arm, step): mean/std/min/max over seeds of each curve."""
  out = []
  for arm in ARMS:
    steps = sorted({r["step"] for r in rows if r["arm"] == arm})
    for step in steps:
      row = dict(arm=arm, step=step)
      for key, _ in CURVES:
        v = np.array([r[key] for r in rows if r["arm"] == arm and r["step"] == step])
        row.update(
          {
            f"{key}_{s}": float(f(v))
            for s, f in (("mean", np.mean), ("std", np.std), ("min", np.min), ("max", np.max))
          }
        )
      row["seeds"] = len(v)
      out.append(row)
  return out


def final_numbers(rows: list[dict], window: int) -> dict:
  """{arm: {curve: (mean, std, min, max) over seeds of the last `window` steps' mean}}."""
  out = {}
  for arm in ARMS:
    seeds = sorted({r["seed"] for r in rows if r["arm"] == arm})
    last = max(r["step"] for r in rows if r["arm"] == arm)
    out[arm] = {}
    for key, _ in CURVES:
      per_seed = np.array(
        [
          np.mean(
            [
              r[key]
              for r in rows
              if r["arm"] == arm and r["seed"] == s and r["step"] > last - window
            ]
          )
          for s in seeds
        ]
      )
      out[arm][key] = (per_seed.mean(), per_seed.std(), per_seed.min(), per_seed.max())
  return out


def _write_csv(path: str, rows: list[dict]) -> None:
  fields = list(dict.fromkeys(k for r in rows for k in r))
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)


def _plot(path: str, summary: list[dict], title: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
  for ax, (key, label) in zip(axes, CURVES, strict=True):
    for arm in ARMS:
      s = [r for r in summary if r["arm"] == arm]
      x = [r["step"] for r in s]
      ax.plot(x, [r[f"{key}_mean"] for r in s], label=LABELS[arm])
      ax.fill_between(x, [r[f"{key}_min"] for r in s], [r[f"{key}_max"] for r in s], alpha=0.2)
    ax.set(xlabel="RL step", ylabel=label, ylim=(0, 1))
    ax.legend(fontsize=8)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def _read_csv(path: str) -> list[dict]:
  with open(path) as f:
    rows = list(csv.DictReader(f))
  number = lambda v: float(v) if v not in ("", None) else float("nan")
  return [
    {k: v if k == "arm" else int(v) if k in ("seed", "step") else number(v) for k, v in r.items()}
    for r in rows
  ]


def write_outputs(workdir: str, rows: list[dict], smoke: bool) -> None:
  """Summary CSV, PNG and the printed final numbers from the per-step rows."""
  seeds = len({r["seed"] for r in rows})
  _write_csv(os.path.join(workdir, "text_feedback_summary.csv"), summarize(rows))
  c = arm_config("sd", 0, smoke)
  _plot(
    os.path.join(workdir, "text_feedback.png"),
    summarize(smoothed(rows, FLAGS.smooth)),
    f"tool-calling env, tiny model, {c.rl.groups}x{c.rl.group_size} episodes/step; "
    f"{FLAGS.smooth}-step moving average per seed; mean and min-max over {seeds} seeds",
  )
  for arm, curves in final_numbers(rows, FLAGS.final_window).items():
    print(
      f"{arm}: "
      + "; ".join(
        f"{key} {m:.3f} ± {s:.3f} [{lo:.3f}, {hi:.3f}]" for key, (m, s, lo, hi) in curves.items()
      )
      + f" (mean of the last {FLAGS.final_window} steps; mean ± std [min, max] over {seeds} seeds)"
    )


def main(argv):
  del argv
  os.makedirs(FLAGS.workdir, exist_ok=True)
  path = os.path.join(FLAGS.workdir, "text_feedback.csv")
  if FLAGS.replot:
    write_outputs(FLAGS.workdir, _read_csv(path), FLAGS.smoke)
    return
  from composer_jax.rl import train as rl_train
  from experiments.tool_feedback import program

  t0 = time.time()
  rows = []
  for seed in range(FLAGS.seeds):
    init, ce = program.warmup(arm_config(ARMS[0], seed, FLAGS.smoke))
    logging.info("seed %d: warm-up CE %.4f (%.0f s)", seed, ce, time.time() - t0)
    for arm in ARMS:
      config = arm_config(arm, seed, FLAGS.smoke)
      for r in rl_train.train(config, program.make_env(config), init):
        rows.append(dict(arm=arm, seed=seed, warmup_ce=ce, **r))
      logging.info("seed %d arm %s done (%.0f s)", seed, arm, time.time() - t0)
  _write_csv(path, rows)
  write_outputs(FLAGS.workdir, rows, FLAGS.smoke)
  print(f"wrote {FLAGS.workdir} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
  app.run(main)
