"""Benchmark: what the integrity layers of #22 cost per grade, as a ratio to the grader before
them.

Both graders grade the same tasks' gold and empty patches: the baseline is the package at
`--baseline` (the commit before the layers; extracted with `git archive`), the new one this
tree. Each side runs in its own process (PYTHONPATH = its tree), sides alternate in rounds so
load from other processes hits both alike, and each process grades one task untimed first
(runtime caches, the monitor worker, the root index). The figure per side is the median over
rounds of the round's total host wall-clock time; the ratio is new / old. Tasks: a seeded
sample of factory tasks (--tasks GLOB), else the synthetic task of experiments/bench/sandbox.py.

  python -m experiments.bench.grading_overhead [--tasks GLOB --n 6] [--rounds 5] \\
      [--baseline 263a2d1]
"""

import glob
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from absl import app, flags

from composer_jax.codetasks import cli
from experiments.bench.sandbox import REPO, make_task, tree_at

# Runs in a subprocess against either tree; prints one JSON line {kind: [seconds per grade]}.
WORKER = r"""
import json, sys, time
try:
  from composer_jax.codetasks.sandbox import grader
  from composer_jax.codetasks.task import Task
except ImportError:  # a tree before composer_jax/codetasks
  try:
    from composer_jax.codetasks.sandbox import grader
  except ImportError:
    from composer_jax.envs.coding import grader
  from composer_jax.codetasks.task import Task
tasks = [Task(**json.loads(line)) for line in open(sys.argv[1])]
grader.grade(tasks[0], tasks[0].gold_patch)  # warm-up, untimed
times = {"gold": [], "empty": []}
for t in tasks:
  for kind, patch in (("gold", t.gold_patch), ("empty", "")):
    s = time.perf_counter()
    g = grader.grade(t, patch)
    times[kind].append(time.perf_counter() - s)
    if g.reward != (1.0 if kind == "gold" else 0.0):
      print(f"warning: {t.id} {kind} scored {g.reward}: {g.error[:200]}", file=sys.stderr)
print(json.dumps(times))
"""


def side(tree: Path, tasks: Path) -> dict:
  env = {**os.environ, "PYTHONPATH": f"{tree}:{REPO}"}
  res = subprocess.run(
    [sys.executable, "-c", WORKER, str(tasks)], env=env, capture_output=True, text=True
  )
  if res.returncode != 0:
    raise SystemExit(f"error: a grading worker failed: {res.stderr.strip()[-500:]}")
  sys.stderr.write(res.stderr)
  return json.loads(res.stdout.strip().splitlines()[-1])


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("tasks", None, "glob of task JSONL files (factory output)", flag_values=fv)
  flags.DEFINE_integer("n", 6, "tasks graded", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("seed", 0, "task sample", lower_bound=0, flag_values=fv)
  flags.DEFINE_integer("rounds", 5, "alternations old/new", lower_bound=1, flag_values=fv)
  flags.DEFINE_string("baseline", "263a2d1", "commit of the grader to compare with", flag_values=fv)


def main(argv) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = flags.FLAGS
  with tempfile.TemporaryDirectory(prefix="cj-bench-ovh-") as tmp:
    tmp = Path(tmp)
    tasks = tmp / "tasks.jsonl"
    if args.tasks:
      lines = [ln for f in sorted(glob.glob(args.tasks)) for ln in open(f) if ln.strip()]
      lines = random.Random(args.seed).sample(lines, min(args.n, len(lines)))
      tasks.write_text("".join(ln if ln.endswith("\n") else ln + "\n" for ln in lines))
    else:
      rec = json.loads(make_task(tmp).read_text())
      full = {"source": {}, "features": [], "problem_statement": "", "deletion_diff": "",
              "provenance": {}, **rec}  # fmt: skip
      tasks.write_text(json.dumps(full) + "\n")
    trees = {"old": tree_at(args.baseline, tmp / "old"), "new": REPO}
    totals = {k: {"gold": [], "empty": []} for k in trees}
    for _ in range(args.rounds):
      for name, tree in trees.items():
        times = side(tree, tasks)
        for kind in ("gold", "empty"):
          totals[name][kind].append(sum(times[kind]))
    med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in totals.items()}
    n = sum(1 for _ in open(tasks))
    out = {
      "tasks": n,
      "rounds": args.rounds,
      "baseline": args.baseline,
      "seconds_per_grade": {
        name: {k: round(v / n, 3) for k, v in m.items()} for name, m in med.items()
      },
      "ratio_new_over_old": {k: round(med["new"][k] / med["old"][k], 3) for k in ("gold", "empty")},
      "ratio_new_over_old_both": round(sum(med["new"].values()) / sum(med["old"].values()), 3),
      "load_average": os.getloadavg(),
    }
  print(json.dumps(out, indent=1))
  return 0


_parse_flags = cli.parse_flags(define_flags)  # app.run's parser (and tests/docs_commands_test)

if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
