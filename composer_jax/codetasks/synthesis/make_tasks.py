"""CLI: synthetic coding tasks from one source project or from a whole manifest.

  python -m composer_jax.codetasks.synthesis.make_tasks --source <sdist|dir|name==ver> --out F.jsonl
  python -m composer_jax.codetasks.synthesis.make_tasks --manifest third_party/coding_sources.json \\
      --out DIR --workers N [--backend local|ray] [--only NAME,...]
  python -m composer_jax.codetasks.synthesis.make_tasks --micro 0:150 --out DIR --workers N

--source writes one project's tasks atomically (a failed run leaves no partial records) and
exits 1 with a one-line error for an unusable source. --manifest runs the factory (factory.py):
projects on a worker pool, resumable, one line per finished project with an ETA, and a summary
table; a project that fails is listed there with its one-line reason and the others go on.
--micro START:STOP (or N = 0:N) runs the same factory on the micro-projects of those seeds
(microprojects.py: small generated packages for laptop-scale tasks); their suites are pure
functions, so one baseline and one validation re-run are the defaults there, and deletions
remove functions (a whole module's gold patch would not fit a small model's turn). Each candidate's
outcome is reported on stderr as it is decided (--quiet: only finished projects).
"""

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from composer_jax.codetasks import task, trees, workers
from composer_jax.codetasks.synthesis import factory, generator, microprojects, sources


def _config(args) -> generator.Config:
  bad = sorted(set(args.kinds.split(",")) - set(generator.Config.kinds))
  if bad:
    raise ValueError(f"--kinds {bad}: valid ones are {list(generator.Config.kinds)}")
  return generator.Config(
    seed=args.seed,
    max_tasks=args.max_tasks,
    max_attempts=args.max_attempts,
    methods=tuple(args.methods.split(",")),
    n_features=args.n_features,
    kinds=tuple(args.kinds.split(",")),
    baseline_runs=args.baseline_runs,
    validation_runs=args.validation_runs,
    verify=not args.no_verify,
  )


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  what = p.add_mutually_exclusive_group(required=True)
  what.add_argument("--source", help="sdist path, project dir, or pinned name==ver")
  what.add_argument("--manifest", type=Path, help="JSON manifest of pinned sdists")
  what.add_argument("--micro", help="micro-project seeds START:STOP, or N for 0:N")
  p.add_argument("--out", required=True, type=Path, help="tasks file (--source) or dir")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--max-tasks", type=int, default=None, help="per project (8; manifest 24)")
  p.add_argument("--max-attempts", type=int, default=30, help="per method")
  p.add_argument("--methods", default=None, help="deletion,bug (--source: deletion)")
  p.add_argument("--n-features", type=int, default=1, help=">1 deletes related features")
  p.add_argument(
    "--kinds",
    default=None,
    help="features deletion may remove (function,class,method,module; micro: function)",
  )
  p.add_argument(
    "--baseline-runs", type=int, default=None, help="besides the coverage run (2; micro 1)"
  )
  p.add_argument("--validation-runs", type=int, default=None, help="(2; micro 1)")
  p.add_argument("--no-verify", action="store_true", help="skip gold=1/empty=0 grading")
  p.add_argument("--workers", type=int, default=1)
  p.add_argument("--backend", default="local", help=f"one of {list(workers.BACKENDS)}")
  p.add_argument("--only", default=None, help="comma-separated project names (manifest)")
  p.add_argument("--quiet", action="store_true", help="no per-candidate progress lines")
  args = p.parse_args(argv)
  manifest_mode = args.manifest is not None or args.micro is not None
  micro = args.micro is not None
  if args.max_tasks is None:
    args.max_tasks = MICRO.max_tasks if micro else 24 if manifest_mode else 8
  if args.methods is None:
    args.methods = ",".join(generator.METHODS) if manifest_mode else "deletion"
  if args.kinds is None:
    args.kinds = ",".join(MICRO.kinds if micro else generator.Config.kinds)
  for name in ("baseline_runs", "validation_runs"):
    if getattr(args, name) is None:
      setattr(args, name, getattr(MICRO if micro else generator.Config, name))
  try:
    cfg = _config(args)
    generator.Generator.check_methods(cfg.methods)
    _check_out(args.out, manifest_mode)
    if manifest_mode:
      return _manifest(args, cfg)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return _single(args, cfg)


# The factory settings of micro-project tasks (the --micro defaults, and `micro_tasks`): pure
# functions, so one baseline and one validation re-run; deletions of functions only.
MICRO = generator.Config(
  max_tasks=6, methods=generator.METHODS, kinds=("function",), baseline_runs=1, validation_runs=1
)


def micro_tasks(spec: str, cache: Path, pool: workers.Pool, log=sys.stderr) -> Path:
  """The task file of micro-projects `spec` (START:STOP or N) made with MICRO settings under
  `cache` on first use (resumable; reused once made); returns its tasks.jsonl."""
  seeds = micro_seeds(spec)
  out = Path(cache) / f"micro-v{microprojects.VERSION}-{seeds.start}-{seeds.stop}"
  if not (out / "tasks.jsonl").is_file():
    print(f"making micro-project tasks {seeds.start}:{seeds.stop} in {out}", file=log, flush=True)
    factory.run([microprojects.entry(i) for i in seeds], out, MICRO, pool, log=log)
  return out / "tasks.jsonl"


def _check_out(out: Path, directory: bool) -> None:
  """One-line ValueError, before any work, for an --out the results could not be written to
  (they would be lost after the whole generation)."""
  if directory and out.exists() and not out.is_dir():
    raise ValueError(f"--out {out} is a file; --manifest / --micro write a directory")
  if not directory and out.is_dir():
    raise ValueError(f"--out {out} is a directory; --source writes one tasks file (F.jsonl)")
  if not directory and not out.parent.is_dir():
    raise ValueError(f"--out {out}: directory {out.parent} does not exist")


def micro_seeds(spec: str) -> range:
  """'START:STOP' or 'N' (= 0:N) -> the seeds; one-line ValueError otherwise."""
  try:
    start, _, stop = spec.rpartition(":")
    seeds = range(int(start or 0), int(stop))
  except ValueError:
    seeds = range(0)
  if not seeds or seeds.start < 0:
    raise ValueError(f"--micro {spec!r}: give START:STOP or N, with 0 <= START < STOP")
  return seeds


def _manifest(args, cfg) -> int:
  if args.micro is not None:
    entries = [microprojects.entry(s) for s in micro_seeds(args.micro)]
  else:
    entries = sources.load_manifest(args.manifest)
  if args.only:
    names = args.only.split(",")
    unknown = sorted(set(names) - {e.get("name") for e in entries if isinstance(e, dict)})
    if unknown:
      raise ValueError(f"--only {unknown}: not in {args.manifest}")
    entries = [e for e in entries if isinstance(e, dict) and e.get("name") in names]
  pool = workers.Pool(args.workers, args.backend)
  summary = factory.run(entries, args.out, cfg, pool, progress=not args.quiet)
  print(factory.table(summary))
  return 0


def _single(args, cfg) -> int:
  start = time.monotonic()
  work = Path(tempfile.mkdtemp(prefix="cj-make-"))
  try:
    src = sources.resolve(args.source, work)
    progress = None if args.quiet else lambda line: print(line, file=sys.stderr, flush=True)
    gen = generator.Generator(src, work, cfg, progress=progress)
    tasks = gen.generate()
  except (ValueError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  finally:
    trees.remove(work)
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
