"""CLI: synthetic coding tasks from one source project or from a whole manifest.

  python -m composer_jax.envs.coding.make_tasks --source <sdist|dir|name==ver> --out F.jsonl
  python -m composer_jax.envs.coding.make_tasks --manifest third_party/coding_sources.json \\
      --out DIR --workers N [--backend local|ray] [--only NAME,...]

--source writes one project's tasks atomically (a failed run leaves no partial records) and
exits 1 with a one-line error for an unusable source. --manifest runs the factory (factory.py):
projects on a worker pool, resumable, one line per finished project with an ETA, and a summary
table; a project that fails is listed there with its one-line reason and the others go on.
"""

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from composer_jax.envs.coding import factory, generator, sources, task, workers


def _config(args) -> generator.Config:
  return generator.Config(
    seed=args.seed,
    max_tasks=args.max_tasks,
    max_attempts=args.max_attempts,
    methods=tuple(args.methods.split(",")),
    n_features=args.n_features,
    baseline_runs=args.baseline_runs,
    validation_runs=args.validation_runs,
    verify=not args.no_verify,
  )


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  what = p.add_mutually_exclusive_group(required=True)
  what.add_argument("--source", help="sdist path, project dir, or pinned name==ver")
  what.add_argument("--manifest", type=Path, help="JSON manifest of pinned sdists")
  p.add_argument("--out", required=True, type=Path, help="tasks file (--source) or dir")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--max-tasks", type=int, default=None, help="per project (8; manifest 24)")
  p.add_argument("--max-attempts", type=int, default=30, help="per method")
  p.add_argument("--methods", default=None, help="deletion,bug (--source: deletion)")
  p.add_argument("--n-features", type=int, default=1, help=">1 deletes related features")
  p.add_argument("--baseline-runs", type=int, default=2, help="besides the coverage run")
  p.add_argument("--validation-runs", type=int, default=2)
  p.add_argument("--no-verify", action="store_true", help="skip gold=1/empty=0 grading")
  p.add_argument("--workers", type=int, default=1)
  p.add_argument("--backend", default="local", help=f"one of {list(workers.BACKENDS)}")
  p.add_argument("--only", default=None, help="comma-separated project names (manifest)")
  args = p.parse_args(argv)
  manifest_mode = args.manifest is not None
  if args.max_tasks is None:
    args.max_tasks = 24 if manifest_mode else 8
  if args.methods is None:
    args.methods = ",".join(generator.METHODS) if manifest_mode else "deletion"
  try:
    cfg = _config(args)
    generator.Generator.check_methods(cfg.methods)
    if manifest_mode:
      return _manifest(args, cfg)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return _single(args, cfg)


def _manifest(args, cfg) -> int:
  entries = sources.load_manifest(args.manifest)
  if args.only:
    names = args.only.split(",")
    unknown = sorted(set(names) - {e.get("name") for e in entries if isinstance(e, dict)})
    if unknown:
      raise ValueError(f"--only {unknown}: not in {args.manifest}")
    entries = [e for e in entries if isinstance(e, dict) and e.get("name") in names]
  pool = workers.Pool(args.workers, args.backend)
  summary = factory.run(entries, args.out, cfg, pool)
  print(factory.table(summary))
  return 0


def _single(args, cfg) -> int:
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
