"""Hiding FAIL_TO_PASS tests from the visible workspace.

A test file whose passing tests are all hidden is removed. Otherwise the hidden test functions
(or methods, for class-based tests) are deleted with libcst, and then module-level data that only
they used (parametrize tables of inputs and expected outputs) is deleted too, to a fixpoint.
Import guards the deletion wrote into test modules (`deletion.guard_test_imports`) that no visible
test uses any more are removed too: they would name the deleted feature in the workspace.
The grader restores the original files, so hiding never affects what is graded.
"""

import collections
from pathlib import Path

import libcst as cst

from composer_jax.codetasks import project
from composer_jax.codetasks.synthesis.deletion import bound_names, count_names


def _split(test_id: str) -> tuple[str, list[str]]:
  file, *parts = test_id.split("::")
  return file, [p.split("[", 1)[0] for p in parts]


def _remove(body, path: list[str], removed: list):
  """body without the def at `path` (class chain + function name); removed nodes appended."""
  out = []
  for stmt in body:
    name = stmt.name.value if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else None
    if name == path[0] and len(path) == 1:
      removed.append(stmt)
      continue
    if name == path[0] and isinstance(stmt, cst.ClassDef):
      inner = _remove(stmt.body.body, path[1:], removed)
      stmt = stmt.with_changes(
        body=stmt.body.with_changes(body=inner or [cst.SimpleStatementLine([cst.Pass()])])
      )
    out.append(stmt)
  return out


def _drop_unused_data(mod: cst.Module, removed_refs: collections.Counter) -> cst.Module:
  while True:
    remaining = count_names(mod)
    dead = [
      s
      for s in mod.body
      if isinstance(s, cst.SimpleStatementLine)
      and not isinstance(s.body[0], (cst.Import, cst.ImportFrom))
      and (names := bound_names(s))
      and all(removed_refs[n] and remaining[n] == count_names(s)[n] for n in names)
    ]
    if not dead:
      return mod
    for s in dead:
      removed_refs += count_names(s)
    mod = mod.with_changes(body=[s for s in mod.body if all(s is not d for d in dead)])


def hide_tests(ws: Path, hidden: list[str], passing: list[str]) -> list[str]:
  """Removes `hidden` test ids from the tree at ws; returns the test files touched."""
  by_file = collections.defaultdict(set)
  for t in hidden:
    by_file[_split(t)[0]].add(t)
  touched = []
  for file, ids in sorted(by_file.items()):
    path = Path(ws) / file
    if not project.is_test_file(file) or not path.exists():
      continue  # doctests of deleted code live (and vanish) with that code
    touched.append(file)
    if all(t in ids for t in passing if t.startswith(file + "::")):
      path.unlink()
      continue
    mod = cst.parse_module(path.read_text(encoding="utf-8"))
    removed = []
    body = list(mod.body)
    # A test class whose every passing test is hidden goes whole (its setup and data too);
    # inherited tests are removed with it although their bodies live in a mixin.
    classes = {_split(t)[1][0] for t in ids if len(_split(t)[1]) > 1}
    for cls in sorted(classes):
      if all(t in ids for t in passing if t.startswith(f"{file}::{cls}::")):
        body = _remove(body, [cls], removed)
    for t in sorted(ids):
      body = _remove(body, _split(t)[1], removed)
    refs = sum((count_names(n) for n in removed), collections.Counter())
    mod = _drop_unused_data(mod.with_changes(body=body), refs)
    path.write_text(mod.code, encoding="utf-8")
  return touched


def _guard_names(stmt) -> list[str]:
  """The names a guard `try: from m import n / except ImportError: n = None` binds (the form
  deletion.guard_test_imports writes), else []."""
  if not isinstance(stmt, cst.Try) or stmt.orelse or stmt.finalbody or len(stmt.handlers) != 1:
    return []
  body, handler = stmt.body.body, stmt.handlers[0]
  if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine):
    return []
  if not (isinstance(body[0].body[0], cst.ImportFrom) and len(body[0].body) == 1):
    return []
  if not (isinstance(handler.type, cst.Name) and handler.type.value == "ImportError"):
    return []
  names, fallback = bound_names(body[0]), []
  for s in handler.body.body:  # exactly `name = None` per imported name
    small = s.body[0] if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 else None
    if not (isinstance(small, cst.Assign) and _is_none(small.value)):
      return []
    fallback += bound_names(s)
  return names if sorted(fallback) == sorted(names) else []


def _is_none(node) -> bool:
  return isinstance(node, cst.Name) and node.value == "None"


def drop_unused_guards(ws: Path, files) -> list[str]:
  """Removes, from the test modules `files` under ws, the import guards whose names nothing
  else in the module uses (their tests were hidden); returns the files changed."""
  changed = []
  for rel in sorted(files):
    path = Path(ws) / rel
    if not path.is_file():
      continue
    mod = cst.parse_module(path.read_text(encoding="utf-8"))
    uses = count_names(mod)
    body = [
      s
      for s in mod.body
      if not (names := _guard_names(s)) or any(uses[n] > count_names(s)[n] for n in names)
    ]
    if len(body) != len(mod.body):
      path.write_text(mod.with_changes(body=body).code, encoding="utf-8")
      changed.append(rel)
  return changed
