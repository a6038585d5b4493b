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

import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from absl import flags

from composer_jax.codetasks import cli, task, trees, workers
from composer_jax.codetasks.synthesis import factory, generator, microprojects, sources


def define_flags(fv: flags.FlagValues) -> None:
  """The command's flags (`cli.parse_flags`): ranges and the output path are checked at
  parse time, one line each."""
  flags.DEFINE_string(
    "source", None, "sdist path, project dir, or pinned name==ver", flag_values=fv
  )
  flags.DEFINE_string("manifest", None, "JSON manifest of pinned sdists", flag_values=fv)
  flags.DEFINE_string("micro", None, "micro-project seeds START:STOP, or N for 0:N", flag_values=fv)
  flags.mark_flags_as_mutual_exclusive(
    ["source", "manifest", "micro"], required=True, flag_values=fv
  )
  flags.DEFINE_string(
    "out", None, "tasks file (--source) or directory", required=True, flag_values=fv
  )
  flags.DEFINE_integer("seed", 0, "generator seed", lower_bound=0, flag_values=fv)
  flags.DEFINE_integer(
    "max_tasks", None, "per project (None: 8; manifest 24; micro 6)", lower_bound=1, flag_values=fv
  )
  flags.DEFINE_integer("max_attempts", 30, "per method", lower_bound=1, flag_values=fv)
  flags.DEFINE_list(
    "methods", None, "deletion,bug (None: --source deletion, else both)", flag_values=fv
  )
  flags.DEFINE_integer(
    "n_features", 1, ">1 deletes related features", lower_bound=1, flag_values=fv
  )
  flags.DEFINE_list(
    "kinds",
    None,
    f"features deletion may remove, of {list(generator.Config.kinds)} (None: all; micro: function)",
    flag_values=fv,
  )
  flags.DEFINE_integer(
    "baseline_runs",
    None,
    "suite runs besides the coverage run (None: 2; micro 1; 0: no flakiness check)",
    lower_bound=0,
    flag_values=fv,
  )
  flags.DEFINE_integer(
    "validation_runs",
    None,
    "re-runs of a kept candidate's suite (None: 2; micro 1)",
    lower_bound=0,
    flag_values=fv,
  )
  flags.DEFINE_boolean(
    "verify", True, "grade gold = 1 and empty = 0 (--noverify: skip)", flag_values=fv
  )
  flags.DEFINE_integer("workers", 1, "processes (or Ray tasks)", lower_bound=1, flag_values=fv)
  flags.DEFINE_enum("backend", "local", list(workers.BACKENDS), "worker pool", flag_values=fv)
  flags.DEFINE_list("only", None, "project names of the manifest to run", flag_values=fv)
  flags.DEFINE_boolean("quiet", False, "no per-candidate progress lines", flag_values=fv)
  flags.register_validator(
    "micro", lambda v: v is None or bool(micro_seeds(v, flags.ValidationError)), flag_values=fv
  )
  flags.register_multi_flags_validator(
    ["out", "source", "manifest", "micro"],
    lambda v: _check_out(Path(v["out"]), v["source"] is None),
    flag_values=fv,
  )


def _config(f, micro: bool, manifest_mode: bool) -> generator.Config:
  kinds = f.kinds or list(MICRO.kinds if micro else generator.Config.kinds)
  bad = sorted(set(kinds) - set(generator.Config.kinds))
  if bad:
    raise ValueError(f"--kinds {bad}: valid ones are {list(generator.Config.kinds)}")
  default = MICRO if micro else generator.Config
  pick = lambda name: getattr(f, name) if getattr(f, name) is not None else getattr(default, name)
  return generator.Config(
    seed=f.seed,
    max_tasks=f.max_tasks or (MICRO.max_tasks if micro else 24 if manifest_mode else 8),
    max_attempts=f.max_attempts,
    methods=tuple(f.methods or (generator.METHODS if manifest_mode else ("deletion",))),
    n_features=f.n_features,
    kinds=tuple(kinds),
    baseline_runs=pick("baseline_runs"),
    validation_runs=pick("validation_runs"),
    verify=f.verify,
  )


def make(f: flags.FlagValues) -> int:
  """The command on parsed flags `f`: 0 made, 1 bad input (one line)."""
  micro = f.micro is not None
  manifest_mode = f.manifest is not None or micro
  try:
    cfg = _config(f, micro, manifest_mode)
    generator.Generator.check_methods(cfg.methods)
    if manifest_mode:
      return _manifest(f, cfg)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return _single(f, cfg)


def run(argv: list[str]) -> int:
  """The command in-process on `argv` (flags only): its exit status (`cli.run`)."""
  return cli.run(define_flags, make, argv)


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


def _check_out(out: Path, directory: bool) -> bool:
  """At parse time: an --out the results could not be written to (they would be lost after
  the whole generation) fails with one line."""
  problem = cli.out_problem(str(out), directory=directory)
  if not problem and not directory and not out.parent.is_dir():
    problem = f"directory {out.parent} does not exist"
  if problem:
    what = "--manifest / --micro write a directory" if directory else "--source writes one file"
    raise flags.ValidationError(f"--out={out}: {problem} ({what})")
  return True


def micro_seeds(spec: str, error: type[Exception] = ValueError) -> range:
  """'START:STOP' or 'N' (= 0:N) -> the seeds; one-line `error` otherwise."""
  try:
    start, _, stop = spec.rpartition(":")
    seeds = range(int(start or 0), int(stop))
  except ValueError:
    seeds = range(0)
  if not seeds or seeds.start < 0:
    raise error(f"--micro {spec!r}: give START:STOP or N, with 0 <= START < STOP")
  return seeds


def _manifest(args, cfg) -> int:
  if args.micro is not None:
    entries = [microprojects.entry(s) for s in micro_seeds(args.micro)]
  else:
    entries = sources.load_manifest(Path(args.manifest))
  if args.only:
    names = args.only
    unknown = sorted(set(names) - {e.get("name") for e in entries if isinstance(e, dict)})
    if unknown:
      raise ValueError(f"--only {unknown}: not in {args.manifest}")
    entries = [e for e in entries if isinstance(e, dict) and e.get("name") in names]
  pool = workers.Pool(args.workers, args.backend)
  summary = factory.run(entries, Path(args.out), cfg, pool, progress=not args.quiet)
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


_parse_flags = cli.parse_flags(define_flags)  # app.run's parser (and tests/docs_commands_test)

if __name__ == "__main__":
  cli.start(define_flags, make)
