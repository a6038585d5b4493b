"""The text-feedback sweep's arm configs and its rows, shared by the sweep that runs them
(`experiments/tool_feedback/sweep.py`) and the figure that plots them
(`experiments/figures/text_feedback.py`).

  arm_config(arm, seed, smoke, behaviour, steps)   an arm's run config
                                                   (`experiments/configs/rl_tool_feedback.py`);
                                                   `smoke` shrinks every size (`SMOKE`).
  expand_arms(arms, sd_coefs)                      the sd_coef sweep: each SD arm at each value.
  write_csv / read_csv                             text_feedback.csv: one row per (behaviour,
                                                   arm, seed, RL step), every metric.
"""

from __future__ import annotations

import csv

SMOKE = {
  "warmup": dict(steps=2, batch_size=4, log_every=1, ckpt_every=1),
  "train": dict(steps=2, log_every=1),
  "rl": dict(groups=2, group_size=2, teacher_rows=4, probe_count=4, gap_rows=4),
}
TEXT = ("arm", "behaviour")  # the columns that are not numbers


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


def expand_arms(arms: list[str], sd_coefs: list[str]) -> list[str]:
  """`arms` with each SD-kind arm ('sd...', 'both...') replaced by 'ARM@COEF' per coefficient."""
  if not sd_coefs:
    return list(arms)
  sd = lambda a: a.split("_")[0] in ("sd", "both")
  return [a2 for a in arms for a2 in ([f"{a}@{c}" for c in sd_coefs] if sd(a) else [a])]


def write_csv(path: str, rows: list[dict]) -> None:
  fields = list(dict.fromkeys(k for r in rows for k in r))
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)


def read_csv(path: str) -> list[dict]:
  """`write_csv`'s rows: seed and step ints, the other columns but `TEXT` floats (NaN if empty)."""
  with open(path) as f:
    rows = list(csv.DictReader(f))
  number = lambda v: float(v) if v not in ("", None) else float("nan")
  return [
    {k: v if k in TEXT else int(v) if k in ("seed", "step") else number(v) for k, v in r.items()}
    for r in rows
  ]
