"""Feature deletion with libcst (formatting and comments of everything kept are preserved).

Deleting a feature removes its definition, then — to a fixpoint — the private helpers, private
constants and imports that only the removed code used, the `__all__` entries and re-export
imports that name it, and non-Python package files that only the removed code mentioned. A
feature is eligible only if nothing else in the package refers to it (so the rest of the
package keeps working). Name use is counted syntactically: Name nodes, attribute names and
string literals (which covers `__all__` and getattr-style references), conservatively.
"""

import collections
import dataclasses
from pathlib import Path

import libcst as cst

from composer_jax.codetasks import project
from composer_jax.codetasks.synthesis.testmap import Symbol


@dataclasses.dataclass
class Deletion:
  changed: dict[str, str | None]  # rel path -> new text, None = file removed
  removed_names: list[str]  # feature + helper names (for the leak scan)
  removed_code: list[str]  # source of every removed definition (for the leak scan)
  stubs: list[str]  # signature + docstring stubs (for the problem statement)
  tests: dict[str, str] = dataclasses.field(default_factory=dict)  # guard_test_imports()


class _Counter(cst.CSTVisitor):
  def __init__(self):
    self.counts = collections.Counter()

  def visit_Name(self, node):
    self.counts[node.value] += 1

  def visit_SimpleString(self, node):
    self.counts[node.evaluated_value if isinstance(node.evaluated_value, str) else ""] += 1


def count_names(node) -> collections.Counter:
  v = _Counter()
  node.visit(v)
  return v.counts


def bound_names(stmt) -> list[str]:
  """Names a top-level statement binds: def/class name, simple assignment target, imports."""
  if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
    return [stmt.name.value]
  if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
    return []
  small = stmt.body[0]
  if isinstance(small, cst.Assign) and len(small.targets) == 1:
    t = small.targets[0].target
    return [t.value] if isinstance(t, cst.Name) else []
  if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
    return [small.target.value]
  if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(
    small.names, cst.ImportStar
  ):
    if isinstance(small, cst.ImportFrom) and _dotted(small.module) == "__future__":
      return []
    out = []
    for alias in small.names:
      n = alias.asname.name if alias.asname else alias.name
      while isinstance(n, cst.Attribute):
        n = n.value
      out.append(n.value)
    return out
  return []


def _dotted(node) -> str:
  if node is None:
    return ""
  if isinstance(node, cst.Name):
    return node.value
  return f"{_dotted(node.value)}.{node.attr.value}"


def _import_target(stmt, importer: str) -> str | None:
  """Absolute module an ImportFrom statement in file `importer` imports from."""
  small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and stmt.body else None
  if not isinstance(small, cst.ImportFrom):
    return None
  level = len(small.relative)
  if level == 0:
    return _dotted(small.module)
  parts = project.module_name(importer).split(".")
  if not importer.endswith("__init__.py"):
    parts = parts[:-1]  # a module's package; a package's __init__ is its own package
  base = parts[: len(parts) - (level - 1)]
  return ".".join([*base, _dotted(small.module)] if small.module else base)


def _drop_import_alias(stmt, name: str):
  """The statement without `name` among its imported aliases (None if nothing is left)."""
  small = stmt.body[0]
  names = [a for a in small.names if (a.asname.name if a.asname else a.name).value != name]
  if not names:
    return None
  names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
  return stmt.with_changes(body=[small.with_changes(names=names)])


def _drop_from_all(stmt, names: set[str]):
  """Removes string entries in `names` from `__all__ = [...]` (also `+=`, annotated forms)."""
  small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and stmt.body else None
  if not isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)) or small.value is None:
    return stmt
  target = small.targets[0].target if isinstance(small, cst.Assign) else small.target
  if not (isinstance(target, cst.Name) and target.value == "__all__"):
    return stmt
  if not isinstance(small.value, (cst.List, cst.Tuple)):
    return stmt
  elements = small.value.elements
  keep = [
    e
    for e in elements
    if not (isinstance(e.value, cst.SimpleString) and e.value.evaluated_value in names)
  ]
  if len(keep) == len(elements):
    return stmt
  if keep and elements[-1].comma is cst.MaybeSentinel.DEFAULT:
    keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
  return stmt.with_changes(body=[small.with_changes(value=small.value.with_changes(elements=keep))])


def guard_test_imports(root: Path, names: set[str]) -> dict[str, str]:
  """Test modules whose top-level `from m import name` of a deleted name would fail their
  import, rewritten so that the name falls back to None instead: the tests that use it fail
  (direct FAIL_TO_PASS), the rest of the module still runs. Unchanged semantics while the
  name exists, so the original tree (gold) passes them as before. rel path -> new text."""
  out = {}
  for rel in project.walk(root):
    # A conftest.py that imports the name breaks every test: no candidate either way.
    if not (rel.endswith(".py") and project.is_test_file(rel)) or rel.endswith("conftest.py"):
      continue
    text = (root / rel).read_text(encoding="utf-8", errors="replace")
    if not any(n in text for n in names):
      continue
    try:
      mod = cst.parse_module(text)
    except cst.ParserSyntaxError:
      continue
    body = []
    for stmt in mod.body:
      one = isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
      small = stmt.body[0] if one else None
      hit = []
      if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
        hit = [a for a in small.names if isinstance(a.name, cst.Name) and a.name.value in names]
      if not hit:
        body.append(stmt)
        continue
      bound = [(a.asname.name if a.asname else a.name).value for a in hit]
      rest = stmt
      for n in bound:
        rest = _drop_import_alias(rest, n) if rest is not None else None
      hit[-1] = hit[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
      imp = mod.code_for_node(cst.SimpleStatementLine([small.with_changes(names=hit)])).strip()
      ind = mod.default_indent
      guard = cst.parse_statement(
        f"try:\n{ind}{imp}\nexcept ImportError:\n" + "".join(f"{ind}{n} = None\n" for n in bound),
        config=mod.config_for_parsing,
      )
      if rest is not None:
        body += [rest, guard]
      else:
        body.append(guard.with_changes(leading_lines=stmt.leading_lines))
    new = mod.with_changes(body=body).code
    if new != text:
      out[rel] = new
  return out


def _tidy(mod: cst.Module) -> cst.Module:
  """Drops blank lines left at the top of a module whose first statement was removed."""
  if not mod.body or not hasattr(mod.body[0], "leading_lines"):
    return mod
  first = mod.body[0]
  lines = list(first.leading_lines)
  while lines and lines[0].comment is None:
    lines.pop(0)
  return mod.with_changes(body=[first.with_changes(leading_lines=lines), *mod.body[1:]])


def _is_text(path: Path) -> bool:
  try:
    path.read_text(encoding="utf-8")
    return True
  except UnicodeDecodeError:
    return False


def stub(module: cst.Module, node) -> str:
  """Signature + docstring of a def/class (public methods for classes), never the body."""

  def fn_stub(fn):
    doc = fn.get_docstring(clean=False)
    body = [cst.SimpleStatementLine([cst.Expr(cst.SimpleString(f'"""{doc}"""'))])] if doc else []
    body.append(cst.SimpleStatementLine([cst.Expr(cst.Ellipsis())]))
    return fn.with_changes(body=cst.IndentedBlock(body))

  if isinstance(node, cst.FunctionDef):
    return module.code_for_node(fn_stub(node)).strip()
  doc = node.get_docstring(clean=False)
  body = [cst.SimpleStatementLine([cst.Expr(cst.SimpleString(f'"""{doc}"""'))])] if doc else []
  body += [
    fn_stub(s)
    for s in node.body.body
    if isinstance(s, cst.FunctionDef)
    and (not s.name.value.startswith("_") or s.name.value == "__init__")
  ]
  body = body or [cst.SimpleStatementLine([cst.Expr(cst.Ellipsis())])]
  return module.code_for_node(node.with_changes(body=cst.IndentedBlock(body))).strip()


class Project:
  """Parsed package modules of a project tree; plans deletions against them."""

  def __init__(self, root: Path):
    self.root = Path(root)
    self.files = project.source_files(self.root)
    self.modules = {
      f: cst.parse_module((self.root / f).read_text(encoding="utf-8")) for f in self.files
    }
    self.counts = {f: count_names(m) for f, m in self.modules.items()}

  def _find(self, sym: Symbol, mod=None):
    """The top-level def/class of `sym` and the nodes to remove (several for overloads)."""
    head, _, meth = sym.qualname.partition(".")
    for stmt in (mod or self.modules[sym.path]).body:
      if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and stmt.name.value == head:
        if sym.kind != "method":
          return stmt, [stmt]
        if isinstance(stmt, cst.ClassDef):
          return stmt, [
            s for s in stmt.body.body if isinstance(s, cst.FunctionDef) and s.name.value == meth
          ]
    return None, []

  def eligible(self, sym: Symbol) -> bool:
    """Public, defined at top level (or a method of a top-level class), used by nothing else."""
    if sym.kind == "module":
      return not sym.path.endswith("__init__.py") and self._module_eligible(sym)
    name = sym.name
    _, nodes = self._find(sym)
    if name.startswith("_") or not nodes:
      return False
    own = sum((count_names(n) for n in nodes), collections.Counter())
    me = project.module_name(sym.path)
    for f, mod in self.modules.items():
      uses = self.counts[f][name] - (own[name] if f == sym.path else 0)
      for stmt in mod.body if sym.kind != "method" else ():
        if name in bound_names(stmt) and f != sym.path:
          if _import_target(stmt, f) not in (me, me.rpartition(".")[0]):
            return False
          uses -= count_names(stmt)[name]
        elif _drop_from_all(stmt, {name}) is not stmt:
          uses -= count_names(stmt)[name]
      if uses:
        return False
    return True

  def _module_imports(self, path: str, f: str, stmt) -> bool:
    """Whether `stmt` in file f is `from pkg import mod`, `from .mod import *`, `import pkg.mod`."""
    full = project.module_name(path)
    base = full.rsplit(".", 1)[-1]
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and stmt.body else None
    if isinstance(small, cst.Import):
      return any(_dotted(a.name) == full for a in small.names)
    target = _import_target(stmt, f)
    if target == full:
      return isinstance(small.names, cst.ImportStar)
    return target == full.rpartition(".")[0] and base in bound_names(stmt)

  def _module_eligible(self, sym: Symbol) -> bool:
    """No other package module uses it beyond importing it whole (or star-importing it)."""
    full = project.module_name(sym.path)
    base = full.rsplit(".", 1)[-1]
    for f, mod in self.modules.items():
      if f == sym.path:
        continue
      uses = self.counts[f][base]
      for stmt in mod.body:
        if self._module_imports(sym.path, f, stmt) or _drop_from_all(stmt, {base}) is not stmt:
          uses -= count_names(stmt)[base]
        elif _import_target(stmt, f) == full:
          return False  # `from .mod import name`: other code uses what it defines
      if uses:
        return False
    return True

  def delete(self, syms: list[Symbol]) -> Deletion:
    """Removes every feature in `syms` (all must be eligible) plus what only they used."""
    mods = dict(self.modules)
    removed_files, names, code, stubs = set(), [], [], []
    for sym in syms:
      mod = mods[sym.path]
      if sym.kind == "module":
        removed_files.add(sym.path)
        code.append(mod.code)
        names.append(sym.name)
        stubs.append(
          f"# module {sym.qualname} ({sym.path})\n"
          + "\n\n".join(
            stub(mod, s)
            for s in mod.body
            if isinstance(s, (cst.FunctionDef, cst.ClassDef)) and not s.name.value.startswith("_")
          )
        )
        self._drop_module_imports(sym.path, mods)
        continue
      owner, nodes = self._find(sym, mod)  # the edited module: features may share a file
      stubs.append(
        f"# {sym.kind} {sym.qualname} in {sym.path}\n" + "\n".join(stub(mod, n) for n in nodes)
      )
      code.extend(mod.code_for_node(n) for n in nodes)
      names.append(sym.name)
      if sym.kind == "method":
        rest = [s for s in owner.body.body if all(s is not n for n in nodes)]
        rest = rest or [cst.SimpleStatementLine([cst.Pass()])]
        new_owner = owner.with_changes(body=owner.body.with_changes(body=rest))
        body = [new_owner if s is owner else s for s in mod.body]
      else:
        body = [_drop_from_all(s, {sym.name}) for s in mod.body if s is not owner]
      removed_refs = sum((count_names(n) for n in nodes), collections.Counter())
      mods[sym.path] = self._drop_dead(
        mod.with_changes(body=body), sym.path, removed_refs, names, code, mods
      )
      if sym.kind != "method":
        self._drop_reexports(sym, mods)
    mods = {f: _tidy(m) if m is not self.modules[f] else m for f, m in mods.items()}
    changed = {
      f: m.code for f, m in mods.items() if m is not self.modules[f] and f not in removed_files
    }
    changed.update({f: None for f in removed_files})
    changed.update(self._stub_edits(syms, set(names)))
    changed.update(self._dead_files(code, changed))
    tests = guard_test_imports(self.root, set(names))
    return Deletion(changed, sorted(set(names)), code, stubs, tests)

  def _stub_edits(self, syms, names: set[str]) -> dict[str, str | None]:
    """Mirrors the deletion in .pyi type stubs, which would otherwise restate the API."""
    out = {}
    stub_files = [f + "i" for f in self.files if (self.root / (f + "i")).exists()]
    gone_modules = {s.path + "i" for s in syms if s.kind == "module"}
    for f in stub_files:
      if f in gone_modules:
        out[f] = None
        continue
      mod = cst.parse_module((self.root / f).read_text(encoding="utf-8"))
      targets = {s.qualname for s in syms if s.path + "i" == f}
      body = []
      for stmt in mod.body:
        name = getattr(getattr(stmt, "name", None), "value", None)
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and name in targets:
          continue
        if isinstance(stmt, cst.ClassDef) and any(t.startswith(name + ".") for t in targets):
          rest = [
            s
            for s in stmt.body.body
            if not (isinstance(s, cst.FunctionDef) and f"{name}.{s.name.value}" in targets)
          ]
          stmt = stmt.with_changes(
            body=stmt.body.with_changes(body=rest or [cst.SimpleStatementLine([cst.Pass()])])
          )
        is_from = isinstance(stmt, cst.SimpleStatementLine) and isinstance(
          stmt.body[0], cst.ImportFrom
        )
        for n in sorted(set(bound_names(stmt)) & names) if is_from else ():
          stmt = _drop_import_alias(stmt, n) if stmt is not None else None
        if stmt is not None:
          body.append(_drop_from_all(stmt, names))
      new = _tidy(mod.with_changes(body=body))
      if new.code != mod.code:
        out[f] = new.code
    return out

  def _drop_dead(self, mod, path, removed_refs, names, code, mods):
    """Removes private helpers and imports that only removed code used, to a fixpoint."""
    while True:
      remaining = count_names(mod)
      for stmt in mod.body:
        bound = [n for n in bound_names(stmt) if removed_refs[n]]
        is_import = isinstance(stmt, cst.SimpleStatementLine) and isinstance(
          stmt.body[0], (cst.Import, cst.ImportFrom)
        )
        dead = [
          n
          for n in bound
          if (is_import or n.startswith("_"))
          and remaining[n] == count_names(stmt)[n]
          and not self._used_elsewhere(n, path, mods)
        ]
        if dead:
          break
      else:
        return mod
      if is_import and len(bound) < len(bound_names(stmt)):
        new = stmt
        for n in dead:
          new = _drop_import_alias(new, n)
        mod = mod.with_changes(body=[new if s is stmt else s for s in mod.body])
        continue
      mod = mod.with_changes(body=[s for s in mod.body if s is not stmt])
      removed_refs += count_names(stmt)
      if not is_import:
        code.append(mod.code_for_node(stmt))
        names.extend(dead)

  def _used_elsewhere(self, name, path, mods) -> bool:
    return any(count_names(m)[name] for f, m in mods.items() if f != path)

  def _drop_reexports(self, sym, mods):
    me = project.module_name(sym.path)
    for f, mod in list(mods.items()):
      if f == sym.path:
        continue
      body = []
      for stmt in mod.body:
        if sym.name in bound_names(stmt) and _import_target(stmt, f) in (me, me.rpartition(".")[0]):
          stmt = _drop_import_alias(stmt, sym.name)
        if stmt is not None:
          body.append(_drop_from_all(stmt, {sym.name}))
      if any(a is not b for a, b in zip(body, mod.body)) or len(body) != len(mod.body):
        mods[f] = mod.with_changes(body=body)

  def _drop_module_imports(self, path, mods):
    """Removes imports of a deleted module (and `__all__` entries naming it) elsewhere."""
    base = project.module_name(path).rsplit(".", 1)[-1]
    for f, mod in list(mods.items()):
      if f == path:
        continue
      body = []
      for stmt in mod.body:
        if self._module_imports(path, f, stmt):
          small = stmt.body[0]
          if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            stmt = _drop_import_alias(stmt, base)
          else:
            stmt = None
        if stmt is not None:
          body.append(_drop_from_all(stmt, {base}))
      if len(body) != len(mod.body) or any(a is not b for a, b in zip(body, mod.body)):
        mods[f] = mod.with_changes(body=body)

  def _dead_files(self, code, changed) -> dict[str, None]:
    """Package data files that only removed code mentioned by name."""
    removed_text = "\n".join(code)
    pkg_dirs = {f.rsplit("/", 1)[0] for f in self.files if "/" in f}
    kept = "\n".join(t for f, t in changed.items() if t) + "\n".join(
      (self.root / f).read_text(encoding="utf-8", errors="replace")
      for f in project.walk(self.root)
      if f.endswith(".py") and f not in changed
    )
    out = {}
    for d in sorted(pkg_dirs):
      for rel in project.walk(self.root / d):
        name = rel.rsplit("/", 1)[-1]
        if (
          not rel.endswith(".py")
          and name in removed_text
          and name not in kept
          and _is_text(self.root / d / rel)
        ):
          out[f"{d}/{rel}"] = None
    return out
