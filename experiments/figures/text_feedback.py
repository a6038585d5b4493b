"""Figure: targeted self-distillation vs RL alone vs a per-turn penalty, for two behaviours.

    python -m experiments.figures.text_feedback --workdir=workdir/text_feedback [--smoke]

For each behaviour of `experiments/configs/rl_tool_feedback.py` ('tools': calls to unavailable
tools, hint = the reminder listing the available tools; 'verbose': verbose answers, hint =
'keep messages short') and each seed: one supervised warm-up, then every arm from the same
warmed-up weights, with the same tasks, sampling keys and episodes per step, each a run of
the program `python -m experiments.run --config=experiments/configs/rl_tool_feedback.py`
runs (`tool_feedback.program.warmed_up`, `rl.run`) in `--workdir/<behaviour>/seed<k>/`
(`warmup/` shared by the arms, one directory per arm): a figure run that stops resumes where
it stopped, and its rows are read from each arm's metrics.jsonl:
  rl       RL only (beta = 0);
  sd       RL + beta * SD on the flagged turns (the report's method; the config's teacher,
           the EMA policy);
  penalty  RL + a dense per-turn penalty on the flagged turns' tokens (`loss.turn_penalty`);
  both     RL + SD + the penalty;
  ARM_TEACHER  an arm with that SD teacher (`loss.teacher`), e.g.
           `--arms=rl,sd_live,sd_ema,sd_frozen`, paired by seed like the others.
Writes to --workdir, besides the runs:
  text_feedback.csv          one row per (behaviour, arm, seed, RL step): every metric;
  text_feedback_summary.csv  per (behaviour, arm, step): mean and 95% t-interval over seeds of
                             the behaviour rate, the reward and the probe KL;
  text_feedback.png          per behaviour: rate, reward and probe KL vs step (each seed's curve a
                             trailing --smooth-step moving average), mean and 95% interval;
and prints, per behaviour and arm, the mean of the last `--final_window` steps and of all steps
(mean and 95% interval over seeds), and the paired (same seed) differences sd - rl, sd - penalty,
penalty - rl and between SD arms of different teachers, with their 95% intervals. --smoke
shrinks every size so the whole pipeline runs in seconds (CI); its numbers mean nothing.
--replot redraws the summary, PNG and numbers from an existing text_feedback.csv; with
--merge=DIR,DIR,... it first concatenates those workdirs' CSVs (one figure run in several
processes, each with its own --first_seed).
"""

from __future__ import annotations

import csv
import os
import time

import numpy as np
from absl import app, flags, logging

from composer_jax.parallel import backend
from composer_jax.train import workdir_lock
from experiments.figures.intervals import interval

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Output directory.", required=True)
flags.DEFINE_bool("smoke", False, "Tiny sizes for CI: runs end to end in seconds.")
flags.DEFINE_integer("seeds", 5, "Seeds per arm (each seed: its own warm-up, shared by arms).")
flags.DEFINE_integer(
  "first_seed",
  0,
  "Seeds run are first_seed .. first_seed + seeds - 1 (to "
  "split one figure over processes; then `--replot --merge=...`).",
)
flags.DEFINE_list("arms", ["rl", "sd", "penalty", "both"], "Arms to run.")
flags.DEFINE_list("behaviours", ["tools", "verbose"], "Behaviours to run.")
flags.DEFINE_bool("replot", False, "Only redraw the summary and PNG from --workdir's CSV.")
flags.DEFINE_list(
  "merge",
  [],
  "With --replot: workdirs of one figure split over processes "
  "(--first_seed); their CSVs are concatenated into --workdir's, then redrawn.",
)
flags.DEFINE_integer("final_window", 10, "Steps averaged for the printed final numbers.")
flags.DEFINE_integer("smooth", 5, "Trailing moving average (steps) of each seed's curve.")
flags.DEFINE_integer(
  "steps",
  0,
  "RL steps per arm (0: the config's train.steps, 80); a "
  "reduced run on a CPU says so with its numbers.",
)

LABELS = {
  "rl": "RL only",
  "sd": "RL + targeted SD",
  "penalty": "RL + per-turn penalty",
  "both": "RL + SD + penalty",
}


def arm_label(arm: str) -> str:
  """'sd_live' -> 'RL + targeted SD (live teacher)'."""
  from experiments.configs import rl_tool_feedback

  kind, teacher = rl_tool_feedback.split_arm(arm)
  return LABELS[kind] + (f" ({teacher} teacher)" if teacher else "")


RATES = {
  "tools": ("unavailable_rate", "calls to unavailable tools"),
  "verbose": ("verbose_rate", "verbose answers"),
}
CURVES = ("rate", "reward", "probe_kl")
SMOKE = {
  "warmup": dict(steps=2, batch_size=4, log_every=1, ckpt_every=1),
  "train": dict(steps=2, log_every=1),
  "rl": dict(groups=2, group_size=2, teacher_rows=4, probe_count=4),
}


def arm_config(arm: str, seed: int, smoke: bool, behaviour: str = "tools", steps: int = 0):
  """The arm's run config for `seed`; `steps` > 0 replaces its RL steps."""
  from experiments.configs import rl_tool_feedback

  c = rl_tool_feedback.get_config(f"{arm},behaviour={behaviour}")
  c.train.seed = seed
  if steps:
    c.train.steps = steps
  if smoke:
    for section, fields in SMOKE.items():
      c[section].update(fields)
    c.warmup.optim.warmup_steps = 1
  return c


def seed_rows(
  workdir: str, behaviour: str, seed: int, arms: list[str], smoke: bool, steps: int = 0
) -> list[dict]:
  """One seed of one behaviour in `<workdir>/<behaviour>/seed<seed>/`: the warm-up
  (`warmup/`), then each arm's RL run (`<arm>/`, `steps` > 0: that many RL steps), each resumed
  or skipped when already there; one row per (arm, RL step `step` = steps done before it, from
  0) of each arm's metrics.jsonl, with `behaviour`, `arm`, `seed` and the warm-up's last CE."""
  from composer_jax.rl import run as rl_run
  from composer_jax.train.metrics import read_metrics
  from experiments.tool_feedback import program

  directory = os.path.join(workdir, behaviour, f"seed{seed}")
  configs = {arm: arm_config(arm, seed, smoke, behaviour, steps) for arm in arms}
  for c in configs.values():  # one compile cache for every run of the figure
    c.train.compile_cache_dir = os.path.join(workdir, "compile_cache")
  init = program.warmed_up(configs[arms[0]], directory)
  ce = read_metrics(os.path.join(directory, "warmup"))[-1]["ce"]
  logging.info("%s seed %d: warm-up CE %.4f", behaviour, seed, ce)
  rows = []
  for arm, config in configs.items():
    run_dir = os.path.join(directory, arm)
    rl_run.run(config, run_dir, program.make_env(config), init)
    rows += [
      dict(behaviour=behaviour, arm=arm, seed=seed, warmup_ce=ce, **{**r, "step": r["step"] - 1})
      for r in read_metrics(run_dir)
    ]
  return rows


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
  arm ('sd', 'sd_TEACHER') - rl and - penalty, penalty - rl, and each pair of SD arms."""
  out = []
  for behaviour in sorted({b for b, _ in final}):
    arms = [a for b, a in final if b == behaviour]
    # Frozen (the ablation) last, so that teacher pairs read 'sd_live - sd_frozen'.
    sd = sorted(
      (a for a in arms if a.partition("_")[0] == "sd"), key=lambda a: a.endswith("_frozen")
    )
    pairs = (
      [(a, b) for a in sd for b in ("rl", "penalty")]
      + [("penalty", "rl")]
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


def _read_csv(path: str) -> list[dict]:
  with open(path) as f:
    rows = list(csv.DictReader(f))
  number = lambda v: float(v) if v not in ("", None) else float("nan")
  text = ("arm", "behaviour")
  return [
    {k: v if k in text else int(v) if k in ("seed", "step") else number(v) for k, v in r.items()}
    for r in rows
  ]


def merge_rows(paths: list[str]) -> list[dict]:
  """The rows of several text_feedback.csv files (one figure split by seed over processes).

  Raises:
    ValueError: a (behaviour, arm, seed, step) row is in more than one file (overlapping
      --first_seed ranges).
  """
  rows, seen = [], {}
  for path in paths:
    part = _read_csv(path)
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
  _write_csv(os.path.join(workdir, "text_feedback_summary.csv"), summarize(rows))
  sizes = []
  for behaviour in dict.fromkeys(r["behaviour"] for r in rows):
    c = arm_config("sd", 0, smoke, behaviour)
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
  backend.ready_or_exit()
  with workdir_lock.held_or_exit(FLAGS.workdir):  # a second figure run here stops at once
    _figure()


def _figure():
  path = os.path.join(FLAGS.workdir, "text_feedback.csv")
  if FLAGS.replot:
    if FLAGS.merge:
      rows = merge_rows([os.path.join(d, "text_feedback.csv") for d in FLAGS.merge])
      _write_csv(path, rows)
    write_outputs(FLAGS.workdir, _read_csv(path), FLAGS.smoke)
    return
  if FLAGS.merge:
    raise app.UsageError("--merge only goes with --replot")
  bad = [b for b in FLAGS.behaviours if b not in RATES]
  if bad:
    raise app.UsageError(f"unknown behaviours {bad}; valid: {sorted(RATES)}")
  for arm in FLAGS.arms:
    try:
      arm_label(arm)
    except ValueError as e:
      raise app.UsageError(str(e)) from None
  t0 = time.time()
  rows = []
  for behaviour in FLAGS.behaviours:
    for seed in range(FLAGS.first_seed, FLAGS.first_seed + FLAGS.seeds):
      rows += seed_rows(FLAGS.workdir, behaviour, seed, FLAGS.arms, FLAGS.smoke, FLAGS.steps)
      logging.info("%s seed %d done (%.0f s)", behaviour, seed, time.time() - t0)
      _write_csv(path, rows)  # after every seed: a long run that stops keeps what it has
  write_outputs(FLAGS.workdir, rows, FLAGS.smoke)
  print(f"wrote {FLAGS.workdir} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
  app.run(main)
