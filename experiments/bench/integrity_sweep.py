"""Measurement: gold 1.0 / empty 0.0 over a seeded sample of factory tasks, and how often each
integrity layer (#22) fires on a correct solution (its false-positive rate).

For every sampled task the gold patch and the empty patch are graded by the grader as it is;
a gold grade that is not 1.0 is charged to the layer that caused it:
  monitor       a critical monitor flag (by rule)          guard   the runtime guard (by event)
  decoy         a decoy test passed                         lying   a value equal to a sentinel
  sites         a reported pass overturned by a hidden expected value
  root leak     the task's code is readable in the sandbox root
  unprotected   a FAIL_TO_PASS test the rewriting cannot protect: the task is not graded
  unsound       the run itself (collected ids, exit status, channel), or anything else.
It also counts what the rewriting did with each FAIL_TO_PASS function (hidden / decoys /
left as it was, with reasons). The corpus is data, never committed; rebuild it with the
factory (BUILD.md, "Reward integrity").

  python -m experiments.bench.integrity_sweep --tasks 'CORPUS/projects/*.jsonl' \\
      [--tasks MORE.jsonl ...] --n 120 [--seed 0] [--out sweep.json]
"""

import collections
import glob
import json
import os
import random
import sys
import time

from absl import app, flags

from composer_jax.codetasks import cli
from composer_jax.codetasks.sandbox import grader
from composer_jax.codetasks.task import read_jsonl


def layer(g: grader.Grade) -> str:
  """The layer a failed gold grade is charged to (module docstring)."""
  kinds = [f["kind"] for f in g.flags if f["severity"] == "critical"]
  info = g.integrity or {}
  if "runtime_guard" in kinds:
    return "guard: " + (info.get("guard") or [{}])[0].get("event", "?")
  if "decoy_passed" in kinds:
    return "decoy"
  if "lying_value" in kinds:
    return "lying"
  if kinds:
    return "monitor: " + ",".join(sorted(set(kinds)))
  if "readable in the sandbox root" in g.error:
    return "root leak"
  if g.error.startswith("task not gradable"):
    return "unprotected"
  if info.get("overturned"):
    return "sites"
  if g.error:
    return "unsound: " + g.error.split(":")[0][:60]
  return "tests failed"


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_multi_string(
    "tasks", None, "glob of task JSONL files (repeatable)", required=True, flag_values=fv
  )
  flags.DEFINE_integer("n", 120, "tasks sampled", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("seed", 0, "task sample", lower_bound=0, flag_values=fv)
  flags.DEFINE_string("out", None, "write the per-task records and summary (JSON)", flag_values=fv)
  cli.check_out("out", fv, directory=False)


def main(argv) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = flags.FLAGS
  files = sorted({f for pattern in args.tasks for f in glob.glob(pattern)})
  tasks = [t for f in files for t in read_jsonl(f)]
  if not tasks:
    print(f"error: no tasks in {args.tasks!r}", file=sys.stderr)
    return 1
  sample = random.Random(args.seed).sample(tasks, min(args.n, len(tasks)))
  rows, start = [], time.monotonic()
  for i, t in enumerate(sample, 1):
    gold = grader.grade(t, t.gold_patch)
    empty = grader.grade(t, "")
    rows.append(
      {
        "id": t.id,
        "project": t.source["name"],
        "method": t.method,
        "gold": gold.reward,
        "empty": empty.reward,
        "gold_layer": None if gold.reward == 1.0 else layer(gold),
        "gold_error": gold.error[:300],
        "gold_critical": sorted({f["kind"] for f in gold.flags if f["severity"] == "critical"}),
        "gold_s": gold.wall_s,
        "integrity": gold.integrity,
      }
    )
    r = rows[-1]
    print(
      f"[{i}/{len(sample)}] {t.id}: gold {r['gold']} empty {r['empty']}"
      + (f" ({r['gold_layer']}: {r['gold_error'][:120]})" if r["gold_layer"] else "")
      + f" {time.monotonic() - start:.0f}s",
      flush=True,
    )
    if args.out:  # after every task: a sweep stopped early keeps what it measured
      write_json(args.out, {"summary": summarize(rows), "rows": rows})
  print(json.dumps(summarize(rows), indent=1))
  return 0


def write_json(path: str, obj) -> None:
  with open(path + ".tmp", "w") as f:
    json.dump(obj, f, indent=1)
  os.replace(path + ".tmp", path)


def summarize(rows: list[dict]) -> dict:
  n = len(rows)
  fired = collections.Counter(r["gold_layer"].split(":")[0] for r in rows if r["gold_layer"])
  detail = collections.Counter(r["gold_layer"] for r in rows if r["gold_layer"])
  funcs = collections.Counter()
  reasons = collections.Counter()
  for r in rows:
    info = r["integrity"] or {}
    funcs["hidden"] += info.get("hidden", 0)
    funcs["decoys"] += info.get("decoys", 0)
    funcs["unprotected"] += len(info.get("unprotected", {}))
    reasons.update(info.get("unprotected", {}).values())
  return {
    "tasks": n,
    "projects": dict(collections.Counter(r["project"] for r in rows)),
    "methods": dict(collections.Counter(r["method"] for r in rows)),
    "gold_1": sum(r["gold"] == 1.0 for r in rows),
    "empty_0": sum(r["empty"] == 0.0 for r in rows),
    "gold_critical": sum(bool(r["gold_critical"]) for r in rows),
    "gold_failures_by_layer": {k: f"{v}/{n} = {v / n:.1%}" for k, v in sorted(fired.items())},
    "gold_failures_detail": dict(detail),
    "rewriting": dict(funcs),
    "unprotected_reasons": dict(reasons.most_common(10)),
    "median_gold_s": sorted(r["gold_s"] for r in rows)[n // 2],
  }


_parse_flags = cli.parse_flags(define_flags)  # app.run's parser (and tests/docs_commands_test)

if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
