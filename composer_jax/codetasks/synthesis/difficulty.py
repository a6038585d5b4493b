"""Difficulty fields of a task, a scalar ranking from them, and near-duplicate removal.

Fields (all from the task record, no test run):
  features       features deleted (1 for an injected bug)
  lines          lines the gold patch adds or removes
  direct_f2p     FAIL_TO_PASS tests that executed the changed code
  collateral_f2p the other FAIL_TO_PASS tests (import errors of a deleted name)
  files          files the gold patch touches
  cross_file     other package modules that import the changed modules (how far the change
                 reaches across the package), counted in the hidden original tree
score() orders tasks easy -> hard for the curriculum; it is a ranking heuristic (more to write,
more behaviour to satisfy, more files), not a calibrated solve probability.
"""

import math
import re

_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+([\w, ()]+)|import\s+([\w., ]+))", re.M)


def _patch_stats(patch: str) -> tuple[int, list[str]]:
  lines, files = 0, []
  for ln in patch.splitlines():
    if ln.startswith("diff --git "):
      files.append(ln.split(" b/", 1)[-1])
    elif ln.startswith(("+", "-")) and not ln.startswith(("+++", "---")):
      lines += 1
  return lines, files


def _module(rel: str) -> str:
  rel = rel[4:] if rel.startswith("src/") else rel
  parts = rel.removesuffix(".py").split("/")
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def cross_file_reach(changed: list[str], sources: dict[str, str]) -> int:
  """Number of other modules in `sources` (rel path -> text) importing a changed module."""
  targets = {_module(r) for r in changed if r.endswith(".py")}
  reach = set()
  for rel, text in sources.items():
    if rel in changed:
      continue
    me = _module(rel).split(".")
    pkg = me if rel.endswith("__init__.py") else me[:-1]
    for frm, names, plain in _IMPORT.findall(text):
      mods = [n.strip() for n in plain.split(",")] if plain else []
      if frm:
        base = frm
        level = len(frm) - len(frm.lstrip("."))
        if level:  # relative: resolve against this module's package
          up = pkg[: len(pkg) - (level - 1)]
          base = ".".join([*up, frm.lstrip(".")]).strip(".")
        mods = [base] + [f"{base}.{n.strip()}" for n in names.strip("()").split(",")]
      if any(m.split(" as ")[0] in targets for m in mods):
        reach.add(rel)
        break
  return len(reach)


def fields(task, sources: dict[str, str]) -> dict:
  """The difficulty fields of `task` (a task.Task); `sources`: the original package modules
  (rel path -> text), for cross_file."""
  lines, files = _patch_stats(task.gold_patch)
  direct = len(task.F2P_direct)
  return {
    "method": task.method,
    "features": len(task.features),
    "lines": lines,
    "direct_f2p": direct,
    "collateral_f2p": len(task.FAIL_TO_PASS) - direct,
    "files": len(files),
    "cross_file": cross_file_reach(files, sources),
  }


def score(f: dict) -> float:
  """Easy -> hard ranking: log lines + features + log direct tests + cross-file reach."""
  return (
    math.log2(1 + f["lines"])
    + 2.0 * (f["features"] - 1)
    + math.log2(1 + f["direct_f2p"])
    + 0.5 * (f["files"] - 1 + f["cross_file"])
  )


def dedup_key(task) -> tuple:
  """Tasks with equal keys are near-identical: the same change to the same feature, whatever
  the project version (paths may move between versions, module-qualified names do not)."""
  feats = tuple(
    sorted((_module(f["path"]), f["qualname"], f.get("mutation", "")) for f in task.features)
  )
  return (task.source["name"], task.method, feats)


def dedup(tasks: list) -> tuple[list, list]:
  """(kept, dropped): the first task of each dedup_key, in input order."""
  seen, kept, dropped = set(), [], []
  for t in tasks:
    k = dedup_key(t)
    (dropped if k in seen else kept).append(t)
    seen.add(k)
  return kept, dropped
