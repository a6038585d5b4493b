"""The task factory: every project of a manifest through the generator, on a worker pool.

Layout of the output directory:
  projects/<name>-<version>.jsonl   the project's validated tasks (written atomically)
  projects/<name>-<version>.json    its status: ok (tasks per method, rejections by reason,
                                    time) or failed (one line: bad hash, unknown project,
                                    unresolvable dependency, no tests, failing suite, ...)
  cache/                            baselines + coverage maps, one per project, reused
  tasks.jsonl                       all tasks, near-duplicates removed (difficulty.dedup)
  summary.json                      per-project table + totals + difficulty distribution
A re-run skips projects that already have a status file (finished, either way). One project's
failure never stops the others.
"""

import collections
import dataclasses
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from composer_jax.codetasks import cli, task, trees, workers
from composer_jax.codetasks.synthesis import difficulty, generator, sources


@dataclasses.dataclass(frozen=True)
class Job:
  entry: dict
  out: Path
  cfg: generator.Config
  progress: bool = False  # each candidate's outcome to stderr as it is decided


def _stderr(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


# A project id names files in the output directory: one plain file name, never a path.
_PLAIN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]*")


def project_id(entry) -> str:
  """`<name>-<version>`, the name of the project's files; ValueError (one line) when the
  manifest entry would make it a path ('../x', 'a/b': files outside the output directory)."""
  pid = f"{entry.get('name')}-{entry.get('version')}" if isinstance(entry, dict) else str(entry)
  if not _PLAIN_ID.fullmatch(pid):
    raise ValueError(
      f"manifest entry {str(entry)[:80]}: its name-version {pid[:80]!r} is not a "
      "plain file name (letters, digits and . _ + ! -, first a letter or digit)"
    )
  return pid


def _reason(line: str) -> str:
  """The rejection category of a generator log line ('<candidate>: <why>')."""
  why = line.split(": ", 1)[-1]
  return re.split(r"[:(\d\[]", why, maxsplit=1)[0].strip() or why[:40]


def run_project(job: Job) -> dict:
  """Generates one project's tasks and writes its files; never raises (failures are records)."""
  pid = project_id(job.entry)
  start = time.monotonic()
  work = Path(tempfile.mkdtemp(prefix="cj-factory-"))
  rec = {"project": pid}
  try:
    src = sources.resolve_entry(job.entry, work)
    gen = generator.Generator(
      src, work, job.cfg, cache=job.out / "cache", progress=_stderr if job.progress else None
    )
    tasks = gen.generate()
    task.write_jsonl(job.out / "projects" / f"{pid}.jsonl", tasks)
    rejected = collections.Counter(_reason(ln) for ln in gen.log if not ln.endswith(": kept"))
    rec.update(
      status="ok",
      tasks=len(tasks),
      by_method=dict(collections.Counter(t.method for t in tasks)),
      attempts=len(gen.log),
      rejected=dict(rejected.most_common()),
      deps=len(src.deps),
      log=gen.log,
    )
  except (ValueError, RuntimeError, OSError, subprocess.SubprocessError) as e:
    rec.update(status="failed", error=" ".join(str(e).split())[:400])
  finally:
    trees.remove(work)
  rec["wall_s"] = round(time.monotonic() - start, 1)
  path = job.out / "projects" / f"{pid}.json"
  path.with_name(path.name + ".partial").write_text(json.dumps(rec, indent=1))
  path.with_name(path.name + ".partial").replace(path)
  return rec


def run(
  manifest: list,
  out: Path,
  cfg: generator.Config,
  pool: workers.Pool,
  log=sys.stderr,
  progress: bool = False,
) -> dict:
  """Runs every unfinished project of `manifest` on `pool`; returns (and writes) the summary.
  One line per finished project goes to `log`; with `progress`, also one per candidate (to the
  workers' stderr)."""
  out = Path(out)
  (out / "projects").mkdir(parents=True, exist_ok=True)
  todo, finished = [], 0
  for entry in manifest:
    if (out / "projects" / f"{project_id(entry)}.json").exists():
      finished += 1
    else:
      todo.append(Job(entry, out, cfg, progress))
  if finished:
    print(f"resuming: {finished} finished projects skipped", file=log, flush=True)
  made, progress = 0, cli.Progress("make_tasks", len(todo), "projects", out=log)
  for i, (job, rec) in enumerate(pool.imap_unordered(run_project, todo), 1):
    if isinstance(rec, BaseException):  # its worker died: no status file, a re-run retries it
      err = f"worker died: {type(rec).__name__}: {rec}"
      rec = {"project": project_id(job.entry), "status": "failed", "wall_s": 0.0, "error": err}
    made += rec.get("tasks", 0)
    what = f"{rec['tasks']} tasks" if rec["status"] == "ok" else f"FAILED: {rec['error']}"
    progress.update(i, f"{rec['project']}: {what} ({rec['wall_s']:.0f} s); {made} tasks made")
  return summarize(manifest, out)


def summarize(manifest: list, out: Path) -> dict:
  """Merges the finished projects' tasks (deduplicated) and writes tasks.jsonl + summary.json."""
  rows, all_tasks = [], []
  for entry in manifest:
    pid = project_id(entry)
    status = out / "projects" / f"{pid}.json"
    if not status.exists():
      rows.append({"project": pid, "status": "pending"})
      continue
    rec = json.loads(status.read_text())
    rows.append({k: v for k, v in rec.items() if k != "log"})
    if rec["status"] == "ok":
      all_tasks += task.read_jsonl(out / "projects" / f"{pid}.jsonl")
  kept, dropped = difficulty.dedup(all_tasks)
  task.write_jsonl(out / "tasks.jsonl", kept)
  fields = collections.defaultdict(list)
  for t in kept:
    for k, v in t.difficulty.items():
      if isinstance(v, (int, float)):
        fields[k].append(v)
  summary = {
    "projects": rows,
    "tasks": len(kept),
    "duplicates_dropped": len(dropped),
    "by_method": dict(collections.Counter(t.method for t in kept)),
    # Checked by the generator before a task is kept: gold patch 1.0, empty patch 0.0.
    "verified": sum(
      t.provenance.get("verify", {}).get("gold") == 1.0
      and t.provenance.get("verify", {}).get("empty") == 0.0
      for t in kept
    ),
    "projects_with_tasks": len({t.source["name"] for t in kept}),
    "failed": {r["project"]: r["error"] for r in rows if r["status"] == "failed"},
    "difficulty": {k: _dist(v) for k, v in sorted(fields.items())},
  }
  (out / "summary.json").write_text(json.dumps(summary, indent=1))
  return summary


def _dist(v: list) -> dict:
  q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
  return {"min": min(v), "p25": q[0], "median": q[1], "p75": q[2], "max": max(v)}


def table(summary: dict) -> str:
  """The per-project summary as a fixed-width text table."""
  head = f"{'project':32} {'status':7} {'del':>4} {'bug':>4} {'time s':>7}  rejected / error"
  lines = [head, "-" * len(head)]
  for r in summary["projects"]:
    by = r.get("by_method", {})
    why = r.get("error") or ", ".join(f"{k} {v}" for k, v in r.get("rejected", {}).items())
    lines.append(
      f"{r['project'][:32]:32} {r['status']:7} {by.get('deletion', 0):>4} {by.get('bug', 0):>4} "
      f"{r.get('wall_s', 0):>7.0f}  {why[:110]}"
    )
  lines.append(
    f"total: {summary['tasks']} tasks {summary['by_method']} ({summary['verified']} verified "
    "gold 1.0 / empty 0.0) from "
    f"{summary['projects_with_tasks']} projects; {summary['duplicates_dropped']} duplicates "
    f"dropped; {len(summary['failed'])} projects failed"
  )
  return "\n".join(lines)
