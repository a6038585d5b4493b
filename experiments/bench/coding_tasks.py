"""Benchmark: coding-task factory throughput with 1 vs N workers, and difficulty distributions.

  python -m experiments.bench.coding_tasks --out /tmp/cj_bench [--workers 2] \\
      [--only webencodings,inflection,six,schema] [--max_tasks 4] [--repeats 1]
  python -m experiments.bench.coding_tasks --summary DIR   # distribution of a finished run

Throughput: the same projects and seed through `factory.run` with a pool of 1 worker, then of N
(fresh output directories, so each run maps coverage and validates from scratch; the sdists
come from the pip cache). Both runs make the same tasks (generation is deterministic), so the
yardstick is tasks per minute of wall time, reported with the ratio N-workers / 1-worker
(median over --repeats). Gold 1.0 / empty 0.0 is checked on every task by the factory itself.
Difficulty: per field (features, lines, direct/collateral FAIL_TO_PASS, files, cross-file
reach) min / quartiles / max over a factory output's tasks.jsonl, by method.
"""

import collections
import json
import shutil
import statistics
import time
from pathlib import Path

from absl import app, flags

from composer_jax.codetasks import cli, task, workers
from composer_jax.codetasks.synthesis import factory, generator, sources


def throughput(entries, out: Path, n_workers: int, cfg: generator.Config) -> dict:
  shutil.rmtree(out, ignore_errors=True)
  start = time.monotonic()
  summary = factory.run(entries, out, cfg, workers.Pool(n_workers))
  wall = time.monotonic() - start
  return {
    "workers": n_workers,
    "tasks": summary["tasks"],
    "wall_s": round(wall, 1),
    "tasks_per_min": round(60 * summary["tasks"] / wall, 2),
    "failed": summary["failed"],
  }


def distribution(out: Path) -> dict:
  tasks = task.read_jsonl(out / "tasks.jsonl")
  res = {}
  for method in sorted({t.method for t in tasks}) + ["all"]:
    sel = [t for t in tasks if method in ("all", t.method)]
    fields = collections.defaultdict(list)
    for t in sel:
      for k, v in t.difficulty.items():
        if isinstance(v, (int, float)):
          fields[k].append(v)
    res[method] = {"tasks": len(sel), **{k: _quartiles(v) for k, v in sorted(fields.items())}}
  return res


def _quartiles(v):
  q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
  return [min(v), q[0], q[1], q[2], max(v)]


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("out", None, "output directory of the factory runs", flag_values=fv)
  cli.check_out("out", fv)
  flags.DEFINE_string(
    "summary", None, "only print the difficulty distribution of this factory DIR", flag_values=fv
  )
  flags.DEFINE_integer("workers", 2, "N of 1 vs N workers", lower_bound=2, flag_values=fv)
  flags.DEFINE_string("only", "webencodings,inflection,six,schema", "projects", flag_values=fv)
  flags.DEFINE_integer("max_tasks", 4, "per project", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("repeats", 1, "runs per worker count", lower_bound=1, flag_values=fv)
  flags.register_multi_flags_validator(
    ["out", "summary"],
    lambda v: bool(v["out"] or v["summary"]),
    message="give --out (a run) or --summary (a distribution)",
    flag_values=fv,
  )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = flags.FLAGS
  if args.summary:
    print(json.dumps(distribution(Path(args.summary)), indent=1))
    return
  names = args.only.split(",")
  entries = [e for e in sources.load_manifest() if e["name"] in names]
  cfg = generator.Config(max_tasks=args.max_tasks, methods=generator.METHODS)
  runs = {1: [], args.workers: []}
  for r in range(args.repeats):
    for n in runs:
      runs[n].append(throughput(entries, Path(args.out) / f"w{n}-r{r}", n, cfg))
      print(json.dumps(runs[n][-1]), flush=True)
  med = {n: statistics.median(x["tasks_per_min"] for x in rs) for n, rs in runs.items()}
  result = {
    "projects": names,
    "median_tasks_per_min": med,
    "ratio": round(med[args.workers] / med[1], 2) if med[1] else None,
    "repeats": args.repeats,
    "difficulty": distribution(Path(args.out) / f"w{args.workers}-r0"),
  }
  print(json.dumps(result, indent=1))


_parse_flags = cli.parse_flags(define_flags)  # app.run's parser (and tests/docs_commands_test)

if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
