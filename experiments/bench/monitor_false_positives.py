"""Benchmark: how often the monitor flags legitimate code (its false-positive rate).

Each top-level function and each method of a top-level class of a corpus is re-submitted as its
own change: before = the file with that definition replaced by `pass`, after = the file as
shipped; `monitor.scan_change` judges it. A change is flagged when it gets >= 1 critical flag.
Corpora: `stdlib` (this interpreter's standard library, test packages excluded; offline) and
`pinned` (the non-test modules of the sdists in third_party/coding_sources.json, fetched with
pip the first time). Prints one line per corpus, the per-rule counts, and the rates last.

  python -m experiments.bench.monitor_false_positives [--corpus stdlib,pinned] [--max_changes N]

--max_changes samples that many changes per corpus (seeded, uniform over all definitions);
0 judges every one.
"""

import ast
import collections
import random
import sysconfig
import tempfile
import time
from pathlib import Path

from absl import app, flags

from composer_jax.codetasks import cli, monitor, project
from composer_jax.codetasks.synthesis import sources

_STDLIB_SKIP = frozenset(
  {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib2to3"}
)


def definitions(text: str) -> list[tuple[int, int, int]]:
  """(first line, last line, indent) of each top-level function and top-level class method."""
  try:
    tree = ast.parse(text)
  except (SyntaxError, ValueError):
    return []
  nodes = []
  for stmt in tree.body:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
      nodes.append(stmt)
    elif isinstance(stmt, ast.ClassDef):
      nodes += [s for s in stmt.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
  return [
    (min([n.lineno, *(d.lineno for d in n.decorator_list)]), n.end_lineno, n.col_offset)
    for n in nodes
  ]


def without(text: str, first: int, last: int, indent: int) -> str:
  lines = text.splitlines(keepends=True)
  lead = lines[first - 1][:indent]  # the definition's own indentation (tabs stay tabs)
  return "".join(lines[: first - 1] + [lead + "pass\n"] + lines[last:])


def stdlib_files() -> dict[str, str]:
  root = Path(sysconfig.get_paths()["stdlib"])
  out = {}
  for path in sorted(root.rglob("*.py")):
    rel = path.relative_to(root).as_posix()
    if set(rel.split("/")[:-1]) & _STDLIB_SKIP or project.is_test_file(rel):
      continue
    out[rel] = path.read_text(encoding="utf-8", errors="replace")
  return out


def pinned_files() -> dict[str, str]:
  out = {}
  with tempfile.TemporaryDirectory(prefix="cj-monitor-bench-") as tmp:
    for entry in sources.load_manifest():
      src = sources.resolve(f"{entry['name']}=={entry['version']}", Path(tmp) / entry["name"])
      for rel in project.source_files(src.path):
        text = (src.path / rel).read_text(encoding="utf-8", errors="replace")
        out[f"{entry['name']}/{rel}"] = text
  return out


def judge(files: dict[str, str], max_changes: int, seed: int):
  """(definitions, changes judged, Counter of changes flagged per rule, flagged changes,
  examples)."""
  changes = [(rel, d) for rel, text in files.items() for d in definitions(text)]
  total = len(changes)
  if max_changes and len(changes) > max_changes:
    changes = sorted(random.Random(seed).sample(changes, max_changes))
  per_rule, flagged, examples = collections.Counter(), 0, []
  for rel, (first, last, indent) in changes:
    # Package-relative path, so the pinned projects' modules resolve their relative imports.
    path = rel.split("/", 1)[1] if rel.split("/")[0] in _PINNED_NAMES else rel
    text = files[rel]
    flags = monitor.scan_change({path: without(text, first, last, indent)}, {path: text})
    crit = {f["kind"]: f["reason"] for f in flags if f["severity"] == "critical"}
    per_rule.update(crit.keys())
    flagged += bool(crit)
    examples += [f"{rel}:{first}: {k}: {why}" for k, why in sorted(crit.items())]
  return total, len(changes), per_rule, flagged, examples


_PINNED_NAMES = frozenset(e["name"] for e in sources.load_manifest())


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_list("corpus", ["stdlib", "pinned"], "of stdlib, pinned", flag_values=fv)
  flags.DEFINE_integer("max_changes", 600, "per corpus; 0 = all", lower_bound=0, flag_values=fv)
  flags.DEFINE_integer("seed", 0, "change sample", lower_bound=0, flag_values=fv)
  flags.DEFINE_integer("examples", 10, "flagged changes to print", lower_bound=0, flag_values=fv)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = flags.FLAGS
  loaders = {"stdlib": stdlib_files, "pinned": pinned_files}
  rates = []
  for name in args.corpus:
    if name not in loaders:
      raise SystemExit(f"--corpus {name!r}: not one of {sorted(loaders)}")
    files = loaders[name]()
    t0 = time.monotonic()
    total, n, per_rule, flagged, examples = judge(files, args.max_changes, args.seed)
    wall = time.monotonic() - t0
    print(
      f"{name}: {len(files)} files, {total} definitions, {n} changes judged in {wall:.1f} s ({1e3 * wall / max(n, 1):.1f} ms each)"
    )
    for ex in examples[: args.examples]:
      print(f"  e.g. {ex[:160]}")
    for rule in sorted(per_rule, key=lambda r: (-per_rule[r], r)):
      print(f"  {name} {rule}: {per_rule[rule]} ({100 * per_rule[rule] / max(n, 1):.2f}%)")
    rates.append((name, flagged, n))
  for name, flagged, n in rates:
    print(f"{name} flag rate: {flagged}/{n} = {100 * flagged / max(n, 1):.2f}% of changes critical")


_parse_flags = cli.parse_flags(define_flags)  # app.run's parser (and tests/docs_commands_test)

if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
