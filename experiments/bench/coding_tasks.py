"""Benchmark: synthetic coding tasks from the pinned PyPI projects in third_party/.

For each source in third_party/coding_sources.json: fetch the sdist with pip (sha256-checked),
generate validated tasks, then grade every task with its gold patch (must be 1.0) and the empty
patch (must be 0.0). Reports tasks per minute of generation and grading latency per task.

  python experiments/bench/coding_tasks.py --out /tmp/coding_bench [--max-tasks 8] [--only NAME]

Needs network access to PyPI (pip download) the first time; sdists are cached afterwards.
"""

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from composer_jax.envs.coding import generator, grader, sources, task


def bench_source(entry: dict, out: Path, max_tasks: int, seed: int) -> dict:
  spec = f"{entry['name']}=={entry['version']}"
  work = Path(tempfile.mkdtemp(prefix="cj-bench-"))
  try:
    t0 = time.monotonic()
    src = sources.resolve(spec, work)
    t_fetch = time.monotonic() - t0
    cfg = generator.Config(seed=seed, max_tasks=max_tasks, verify=False)
    gen = generator.Generator(src, work, cfg)
    t1 = time.monotonic()
    tasks = gen.generate()
    t_gen = time.monotonic() - t1
  finally:
    shutil.rmtree(work, ignore_errors=True)
  task.write_jsonl(out / f"{entry['name']}.jsonl", tasks)
  gold, empty, latency = [], [], []
  for t in tasks:
    s = time.monotonic()
    gold.append(grader.grade(t, t.gold_patch).reward)
    latency.append(time.monotonic() - s)
    empty.append(grader.grade(t, "").reward)
  return {
    "source": spec,
    "fetch_s": round(t_fetch, 1),
    "generate_s": round(t_gen, 1),
    "attempts": len(gen.log),
    "tasks": len(tasks),
    "tasks_per_minute": round(60 * len(tasks) / t_gen, 2) if t_gen else None,
    "gold_1.0": sum(r == 1.0 for r in gold),
    "empty_0.0": sum(r == 0.0 for r in empty),
    "grade_latency_s_median": round(statistics.median(latency), 2) if latency else None,
    "grade_latency_s_max": round(max(latency), 2) if latency else None,
    "n_fail_to_pass": [len(t.FAIL_TO_PASS) for t in tasks],
    "n_pass_to_pass": [len(t.PASS_TO_PASS) for t in tasks],
    "features": [t.features for t in tasks],
    "rejections": gen.log,
  }


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", type=Path, required=True)
  p.add_argument("--max-tasks", type=int, default=8)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--only", default=None, help="bench one source name")
  args = p.parse_args()
  args.out.mkdir(parents=True, exist_ok=True)
  results = []
  for entry in sources.load_manifest():
    if args.only and entry["name"] != args.only:
      continue
    results.append(bench_source(entry, args.out, args.max_tasks, args.seed))
    print(
      json.dumps({k: v for k, v in results[-1].items() if k not in ("features", "rejections")}),
      flush=True,
    )
  summary = {
    "per_source": results,
    "total_tasks": sum(r["tasks"] for r in results),
    "gold_1.0": sum(r["gold_1.0"] for r in results),
    "empty_0.0": sum(r["empty_0.0"] for r in results),
  }
  (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
  print(json.dumps({k: v for k, v in summary.items() if k != "per_source"}))


if __name__ == "__main__":
  main()
