"""CLI: python -m composer_jax.envs.coding.make_tasks --source <sdist|dir|name==ver> --out F.jsonl

Generates validated tasks from one source project and writes them atomically (a failed run
leaves no partial records). Exit status 1 with a one-line error for unusable sources.
"""

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from composer_jax.envs.coding import generator, sources, task


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--source", required=True, help="sdist path, project dir, or pinned name==ver")
  p.add_argument("--out", required=True, type=Path)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--max-tasks", type=int, default=8)
  p.add_argument("--max-attempts", type=int, default=30)
  p.add_argument("--n-features", type=int, default=1, help=">1 deletes related features")
  p.add_argument("--baseline-runs", type=int, default=2, help="besides the coverage run")
  p.add_argument("--validation-runs", type=int, default=2)
  p.add_argument("--no-verify", action="store_true", help="skip gold=1/empty=0 grading")
  args = p.parse_args(argv)
  cfg = generator.Config(
    seed=args.seed,
    max_tasks=args.max_tasks,
    max_attempts=args.max_attempts,
    n_features=args.n_features,
    baseline_runs=args.baseline_runs,
    validation_runs=args.validation_runs,
    verify=not args.no_verify,
  )
  start = time.monotonic()
  work = Path(tempfile.mkdtemp(prefix="cj-make-"))
  try:
    src = sources.resolve(args.source, work)
    gen = generator.Generator(src, work, cfg)
    tasks = gen.generate()
  except (ValueError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  finally:
    shutil.rmtree(work, ignore_errors=True)
  task.write_jsonl(args.out, tasks)
  print(
    json.dumps(
      {
        "source": src.as_dict(),
        "tasks": len(tasks),
        "wall_s": round(time.monotonic() - start, 1),
        "log": gen.log,
        "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "limits"},
      },
      indent=1,
    )
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
