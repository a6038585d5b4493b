"""The text-feedback sweep: every arm x seed x behaviour of the tool-calling program, run.

    python -m experiments.tool_feedback.sweep --workdir=workdir/text_feedback [--smoke]
    python -m experiments.figures.text_feedback --workdir=workdir/text_feedback   # plots it

For each behaviour of `experiments/configs/rl_tool_feedback.py` ('tools': calls to unavailable
tools, hint = the reminder listing the available tools; 'verbose': verbose answers, hint =
'keep messages short') and each seed: one supervised warm-up, then every arm from the same
warmed-up weights, with the same tasks, sampling keys and episodes per step, each a run of
the program `python -m experiments.run --config=experiments/configs/rl_tool_feedback.py`
runs (`tool_feedback.program.warmed_up`, `rl.run`) in `--workdir/<behaviour>/seed<k>/`
(`warmup/` shared by the arms, one directory per arm): a sweep that stops resumes where it
stopped, and its rows are read from each arm's metrics.jsonl. Arms are the config's
(`rl_tool_feedback.split_arm`): rl, lr0 (learning rate 0: the noise floor), sd (= sd_hint),
sd_sdpo, sd_rlvr, penalty, both, with a teacher (sd_live, sd_frozen, ...) or an `loss.sd_coef`
('sd_hint@0.3'); `--sd_coefs=0.1,0.3,1` runs every SD arm at each coefficient (the sweep of
beta), as arms 'ARM@COEF'.

Writes `--workdir/text_feedback.csv` (one row per (behaviour, arm, seed, RL step): every metric,
after every seed, so a long sweep that stops keeps what it has); the figure, summary and printed
numbers are `experiments.figures.text_feedback`'s. --smoke shrinks every size so the whole
pipeline runs in seconds (CI); its numbers mean nothing. One sweep split over processes: each
its own --workdir and --first_seed, then `experiments.figures.text_feedback --merge=DIR,...`.
"""

from __future__ import annotations

import os
import time

from absl import app, flags, logging

from composer_jax.parallel import backend
from composer_jax.train import workdir_lock
from experiments.tool_feedback.arms import arm_config, expand_arms, write_csv

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Output directory.", required=True)
flags.DEFINE_bool("smoke", False, "Tiny sizes for CI: runs end to end in seconds.")
flags.DEFINE_integer("seeds", 5, "Seeds per arm (each seed: its own warm-up, shared by arms).")
flags.DEFINE_integer(
  "first_seed",
  0,
  "Seeds run are first_seed .. first_seed + seeds - 1 (to split one sweep over processes).",
)
flags.DEFINE_list("arms", ["rl", "sd", "penalty", "both"], "Arms to run.")
flags.DEFINE_list(
  "sd_coefs", [], "Run every SD arm at each of these loss.sd_coef values ('ARM@COEF')."
)
flags.DEFINE_list("behaviours", ["tools", "verbose"], "Behaviours to run.")
flags.DEFINE_integer(
  "steps",
  0,
  "RL steps per arm (0: the config's train.steps, 80); a reduced run on a CPU says so with its "
  "numbers.",
)


def seed_rows(
  workdir: str, behaviour: str, seed: int, arms: list[str], smoke: bool, steps: int = 0
) -> list[dict]:
  """One seed of one behaviour in `<workdir>/<behaviour>/seed<seed>/`: the warm-up
  (`warmup/`), then each arm's RL run (`<arm>/`, `steps` > 0: that many RL steps), each resumed
  or skipped when already there; one row per (arm, RL step `step` = steps done before it, from
  0) of each arm's metrics.jsonl, with `behaviour`, `arm`, `seed` and the warm-up's last CE.

  Raises:
    train.loop.Preempted: a preemption signal (SIGTERM) stopped an arm after its checkpoint:
      the sweep stops too (the later arms do not run), and a rerun resumes.
  """
  from composer_jax.rl import run as rl_run
  from composer_jax.train import loop
  from composer_jax.train.metrics import read_metrics
  from experiments.tool_feedback import program

  directory = os.path.join(workdir, behaviour, f"seed{seed}")
  configs = {arm: arm_config(arm, seed, smoke, behaviour, steps) for arm in arms}
  for c in configs.values():  # one compile cache for every run of the sweep
    c.train.compile_cache_dir = os.path.join(workdir, "compile_cache")
  init = program.warmed_up(configs[arms[0]], directory)
  ce = read_metrics(os.path.join(directory, "warmup"))[-1]["ce"]
  logging.info("%s seed %d: warm-up CE %.4f", behaviour, seed, ce)
  rows = []
  for arm, config in configs.items():
    run_dir = os.path.join(directory, arm)
    rl_run.run(config, run_dir, program.make_env(config), init)
    records = read_metrics(run_dir)
    if not records or records[-1]["step"] < config.train.steps:
      done = records[-1]["step"] if records else 0
      raise loop.Preempted(
        f"{run_dir} stopped at step {done} of {config.train.steps} (preemption signal, "
        "checkpoint saved); run the sweep again to resume"
      )
    rows += [
      dict(behaviour=behaviour, arm=arm, seed=seed, warmup_ce=ce, **{**r, "step": r["step"] - 1})
      for r in records
    ]
  return rows


def main(argv):
  del argv
  backend.ready_or_exit()
  os.makedirs(FLAGS.workdir, exist_ok=True)
  with workdir_lock.held_or_exit(FLAGS.workdir):  # a second sweep here stops at once
    _sweep()


def _sweep():
  from experiments.configs import rl_tool_feedback

  bad = [b for b in FLAGS.behaviours if b not in rl_tool_feedback.BEHAVIOURS]
  if bad:
    raise app.UsageError(f"unknown behaviours {bad}; valid: {list(rl_tool_feedback.BEHAVIOURS)}")
  arms = expand_arms(FLAGS.arms, FLAGS.sd_coefs)
  for arm in arms:
    try:
      rl_tool_feedback.split_arm(arm)
    except ValueError as e:
      raise app.UsageError(str(e)) from None
  path = os.path.join(FLAGS.workdir, "text_feedback.csv")
  t0 = time.time()
  rows = []
  from composer_jax.train import loop

  for behaviour in FLAGS.behaviours:
    for seed in range(FLAGS.first_seed, FLAGS.first_seed + FLAGS.seeds):
      try:
        rows += seed_rows(FLAGS.workdir, behaviour, seed, arms, FLAGS.smoke, FLAGS.steps)
      except loop.Preempted as e:  # the warm-up's or an arm's checkpoint is saved
        raise SystemExit(f"sweep stopped: {e}") from None
      logging.info("%s seed %d done (%.0f s)", behaviour, seed, time.time() - t0)
      write_csv(path, rows)
  smoke = " --smoke" if FLAGS.smoke else ""
  print(
    f"wrote {path} in {time.time() - t0:.0f} s; plot it: "
    f"python -m experiments.figures.text_feedback --workdir={FLAGS.workdir}{smoke}"
  )


if __name__ == "__main__":
  app.run(main)
