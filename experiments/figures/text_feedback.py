"""Figure: targeted self-distillation vs RL alone vs a per-turn penalty, for two behaviours.

    python -m experiments.tool_feedback.sweep --workdir=DIR [--smoke]      # runs the arms
    python -m experiments.figures.text_feedback --workdir=DIR [--smoke]    # plots them

Reads `DIR/text_feedback.csv` (the sweep's rows: one per (behaviour, arm, seed, RL step), every
metric; `experiments/tool_feedback/sweep.py` says what the arms are) and writes to DIR:
  text_feedback_summary.csv  per (behaviour, arm, step): mean and 95% t-interval over seeds of
                             the behaviour rate, the reward and the probe KL;
  text_feedback.png          per behaviour: rate, reward and probe KL vs step (each seed's curve a
                             trailing --smooth-step moving average), mean and 95% interval;
and prints, per behaviour and arm, the mean of the last `--final_window` steps and of all steps
(mean and 95% interval over seeds), and the paired (same seed) differences of each SD arm to
rl, lr0 and penalty, penalty - rl, rl - lr0 and between SD arms, with their 95% intervals.
--merge=DIR,DIR,... first concatenates those workdirs' CSVs into DIR's (one sweep run in several
processes, each with its own --first_seed). --smoke: the CSV is a smoke sweep's (the title's
sizes). The committed outputs under `experiments/figures/results/` were written this way.
"""

from __future__ import annotations

import os

import numpy as np
from absl import app, flags

from experiments.figures.intervals import interval
from experiments.tool_feedback import arms

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory with the sweep's text_feedback.csv.", required=True)
flags.DEFINE_bool("smoke", False, "The CSV is from a smoke sweep (the sizes in the title).")
flags.DEFINE_list(
  "merge",
  [],
  "Workdirs of one sweep split over processes (--first_seed); their CSVs are concatenated "
  "into --workdir's, then plotted.",
)
flags.DEFINE_integer("final_window", 10, "Steps averaged for the printed final numbers.")
flags.DEFINE_integer("smooth", 5, "Trailing moving average (steps) of each seed's curve.")

LABELS = {
  "rl": "RL only",
  "lr0": "RL at lr 0 (noise floor)",
  "sd": "RL + targeted SD",
  "penalty": "RL + per-turn penalty",
  "both": "RL + SD + penalty",
}


def arm_label(arm: str) -> str:
  """'sd_live' -> 'RL + targeted SD (live teacher)', 'sd_sdpo@0.3' -> 'RL + targeted SD (sdpo,
  sd_coef 0.3)'."""
  from experiments.configs import rl_tool_feedback

  kind, variant, teacher, coef = rl_tool_feedback.split_arm(arm)
  parts = [
    variant or "",
    f"{teacher} teacher" if teacher else "",
    f"sd_coef {coef:g}" if coef is not None else "",
  ]
  extra = ", ".join(p for p in parts if p)
  return LABELS[kind] + (f" ({extra})" if extra else "")


RATES = {
  "tools": ("unavailable_rate", "calls to unavailable tools"),
  "verbose": ("verbose_rate", "verbose answers"),
}
CURVES = ("rate", "reward", "probe_kl")


def _value(row: dict, curve: str) -> float:
  key = RATES[row["behaviour"]][0] if curve == "rate" else curve
  return float(row.get(key, float("nan")))


def _runs(rows: list[dict]) -> dict[tuple, list[dict]]:
  """(behaviour, arm, seed) -> that run's rows in step order."""
  out: dict[tuple, list[dict]] = {}
  for r in rows:
    out.setdefault((r["behaviour"], r["arm"], r["seed"]), []).append(r)
  return {k: sorted(v, key=lambda r: r["step"]) for k, v in sorted(out.items())}


def smoothed(rows: list[dict], window: int) -> list[dict]:
  """Each run's curves replaced by their trailing `window`-step moving average."""
  out = []
  for run in _runs(rows).values():
    for i, r in enumerate(run):
      past = run[max(0, i - window + 1) : i + 1]
      key = RATES[r["behaviour"]][0]
      out.append(
        dict(
          r,
          **{
            k: float(np.mean([float(p.get(k, np.nan)) for p in past]))
            for k in (key, "reward", "probe_kl")
          },
        )
      )
  return out


def summarize(rows: list[dict]) -> list[dict]:
  """Per (behaviour, arm, step): mean, 95% interval (lo, hi) and seed count of each curve."""
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    groups.setdefault((r["behaviour"], r["arm"], r["step"]), []).append(r)
  out = []
  for (behaviour, arm, step), rs in sorted(groups.items()):
    row = dict(behaviour=behaviour, arm=arm, step=step, seeds=len(rs))
    for curve in CURVES:
      mean, half = interval([_value(r, curve) for r in rs])
      row.update({f"{curve}_mean": mean, f"{curve}_lo": mean - half, f"{curve}_hi": mean + half})
    out.append(row)
  return out


def final_numbers(rows: list[dict], window: int) -> dict:
  """{(behaviour, arm): {curve: per-seed means of the last `window` steps, by seed}}."""
  out: dict[tuple, dict] = {}
  for (behaviour, arm, seed), run in _runs(rows).items():
    last = run[-1]["step"]
    tail = [r for r in run if r["step"] > last - window]
    per = out.setdefault((behaviour, arm), {c: {} for c in CURVES})
    for curve in CURVES:
      per[curve][seed] = float(np.mean([_value(r, curve) for r in tail]))
  return out


def comparisons(final: dict) -> list[tuple]:
  """(behaviour, curve, 'a - b', mean, half-width) of the paired per-seed differences: each SD
  arm ('sd', 'sd_VARIANT', 'sd_TEACHER', 'sd...@COEF') - rl, - lr0 and - penalty, penalty - rl,
  rl - lr0, and each pair of SD arms."""
  out = []
  for behaviour in sorted({b for b, _ in final}):
    names = [a for b, a in final if b == behaviour]
    # Frozen (the ablation) last, so that teacher pairs read 'sd_live - sd_frozen'.
    sd = sorted(
      (a for a in names if a.partition("@")[0].partition("_")[0] == "sd"),
      key=lambda a: a.endswith("_frozen"),
    )
    pairs = (
      [(a, b) for a in sd for b in ("rl", "lr0", "penalty")]
      + [("penalty", "rl"), ("rl", "lr0")]
      + [(a, b) for i, a in enumerate(sd) for b in sd[i + 1 :]]
    )
    for a, b in pairs:
      if (behaviour, a) not in final or (behaviour, b) not in final:
        continue
      for curve in CURVES:
        x, y = final[behaviour, a][curve], final[behaviour, b][curve]
        diffs = [x[s] - y[s] for s in sorted(set(x) & set(y))]
        out.append((behaviour, curve, f"{a} - {b}", *interval(diffs)))
  return out


def _plot(path: str, summary: list[dict], title: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  behaviours = list(dict.fromkeys(r["behaviour"] for r in summary))
  fig, axes = plt.subplots(len(behaviours), 3, figsize=(13, 3.6 * len(behaviours)), squeeze=False)
  for row_axes, behaviour in zip(axes, behaviours, strict=True):
    labels = (RATES[behaviour][1], "task reward", "probe KL(student || teacher), nats")
    for ax, curve, label in zip(row_axes, CURVES, labels, strict=True):
      for arm in dict.fromkeys(r["arm"] for r in summary if r["behaviour"] == behaviour):
        s = [r for r in summary if (r["behaviour"], r["arm"]) == (behaviour, arm)]
        x = [r["step"] for r in s]
        ax.plot(x, [r[f"{curve}_mean"] for r in s], label=arm_label(arm))
        ax.fill_between(x, [r[f"{curve}_lo"] for r in s], [r[f"{curve}_hi"] for r in s], alpha=0.2)
      ax.set(xlabel="RL step", ylabel=label, title=f"{behaviour}: {label}")
      ax.title.set_fontsize(9)
      ax.legend(fontsize=7)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def merge_rows(paths: list[str]) -> list[dict]:
  """The rows of several text_feedback.csv files (one figure split by seed over processes).

  Raises:
    ValueError: a (behaviour, arm, seed, step) row is in more than one file (overlapping
      --first_seed ranges).
  """
  rows, seen = [], {}
  for path in paths:
    part = arms.read_csv(path)
    for r in part:
      key = (r["behaviour"], r["arm"], r["seed"], r["step"])
      if key in seen:
        raise ValueError(
          f"row (behaviour, arm, seed, step) = {key} is in both {seen[key]} and "
          f"{path}: the parts' --first_seed ranges overlap"
        )
      seen[key] = path
    rows += part
  return rows


def write_outputs(workdir: str, rows: list[dict], smoke: bool) -> None:
  """Summary CSV, PNG and the printed final numbers from the per-step rows."""
  seeds = len({r["seed"] for r in rows})
  arms.write_csv(os.path.join(workdir, "text_feedback_summary.csv"), summarize(rows))
  sizes = []
  for behaviour in dict.fromkeys(r["behaviour"] for r in rows):
    c = arms.arm_config("sd", 0, smoke, behaviour)
    sizes.append(f"{behaviour} {c.rl.groups}x{c.rl.group_size}")
  _plot(
    os.path.join(workdir, "text_feedback.png"),
    summarize(smoothed(rows, FLAGS.smooth)),
    f"tool-calling env, tiny model, episodes/step: {', '.join(sizes)}; "
    f"{FLAGS.smooth}-step moving average per seed; mean and 95% interval over {seeds} seeds",
  )
  steps = len({r["step"] for r in rows})
  # The final window says where each arm ends; the whole-run mean (area under the curve) also
  # says how fast it gets there.
  for window, what in (
    (FLAGS.final_window, f"mean of the last {FLAGS.final_window} steps"),
    (steps, f"mean of all {steps} steps"),
  ):
    final = final_numbers(rows, window)
    for (behaviour, arm), curves in final.items():
      parts = []
      for curve, per_seed in curves.items():
        mean, half = interval(per_seed.values())
        parts.append(f"{curve} {mean:.3f} ± {half:.3f}")
      print(
        f"{behaviour} {arm}: "
        + "; ".join(parts)
        + f" ({what}; mean ± 95% interval over {len(per_seed)} seeds)"
      )
    for behaviour, curve, name, mean, half in comparisons(final):
      print(f"{behaviour} {curve} {name}: {mean:+.3f} ± {half:.3f} (paired by seed; {what})")


def main(argv):
  del argv
  path = os.path.join(FLAGS.workdir, "text_feedback.csv")
  if FLAGS.merge:
    os.makedirs(FLAGS.workdir, exist_ok=True)
    arms.write_csv(path, merge_rows([os.path.join(d, "text_feedback.csv") for d in FLAGS.merge]))
  if not os.path.exists(path):
    raise app.UsageError(
      f"{path} does not exist: run the sweep first (python -m experiments.tool_feedback.sweep "
      f"--workdir={FLAGS.workdir}) or give --merge"
    )
  write_outputs(FLAGS.workdir, arms.read_csv(path), FLAGS.smoke)


if __name__ == "__main__":
  app.run(main)
