"""Shared views of a parsed module that several code rules read (computed once per module)."""

import ast
import builtins

from composer_jax.codetasks.monitor.context import Module
from composer_jax.codetasks.monitor.names import MOCK_PATCH, MUTATORS, OBJECT_SETATTR, matches
from composer_jax.codetasks.monitor.resolve import nfkc


def cached(fn):
  key = fn.__name__

  def get(m: Module):
    cache = m.__dict__.setdefault("_rule_cache", {})
    if key not in cache:
      cache[key] = fn(m)
    return cache[key]

  return get


# ---- shared views of a module ---------------------------------------------------------------
def own(m: Module, name: str) -> bool:
  """name lies in the module's own top-level package (the project's code, not a library)."""
  own = m.module.split(".")[0]
  return bool(own) and (name == own or name.startswith(own + "."))


@cached
def references(m: Module) -> list[tuple[ast.AST, str]]:
  """(node, dotted name) for each maximal resolved expression and each imported name."""
  out = []
  for node in m.nodes(ast.Name, ast.Attribute, ast.Call, ast.Subscript):
    names = m.resolve(node)
    p = m.parent.get(id(node))
    if not names or (
      isinstance(p, (ast.Attribute, ast.Subscript)) and p.value is node and m.resolve(p)
    ):
      continue  # unresolved, or part of a longer resolved name
    out.extend((node, n) for n in sorted(names) if not own(m, n))
  for node in m.nodes(ast.Import):
    out.extend((node, nfkc(a.name)) for a in node.names)
  for node in m.nodes(ast.ImportFrom):
    base = m.resolver._import_name(node)
    out.append((node, base))
    out.extend((node, f"{base}.{nfkc(a.name)}") for a in node.names if a.name != "*")
  return out


@cached
def mutations(m: Module) -> list[tuple[ast.AST, str, str]]:
  """(node, dotted name, how) for every assignment, deletion, setattr, monkeypatch, mock.patch
  or mutating method call on something with a resolved name."""
  out = []

  def targets(t):
    if isinstance(t, (ast.Tuple, ast.List)):
      for e in t.elts:
        yield from targets(e)
    elif isinstance(t, ast.Starred):
      yield from targets(t.value)
    else:
      yield t

  def target_names(t) -> set[str]:
    if isinstance(t, ast.Attribute):
      return {f"{b}.{nfkc(t.attr)}" for b in m.resolve(t.value)}
    if isinstance(t, ast.Subscript):
      if m.resolver.is_namespace(t.value):  # vars(m)[k] / m.__dict__[k] / __builtins__[k]
        return set(m.resolve(t))
      return {f"{b}[]" for b in m.resolve(t.value)}  # sys.modules[k], os.environ[k]
    return set()

  for node in m.nodes(ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete):
    tlist = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
    how = "del" if isinstance(node, ast.Delete) else "assignment"
    for t in (x for tt in tlist for x in targets(tt)):
      out.extend((node, n, how) for n in sorted(target_names(t)))
  for call in m.nodes(ast.Call):
    callee = m.callee(call)
    obj, attr = m.arg(call, 0), m.arg(call, 1)
    if callee & {".__setattr__", ".__delattr__"} and not callee & OBJECT_SETATTR:
      obj, attr = call.func.value, m.arg(call, 0)  # x.__setattr__(name, v)
    if callee & ({"builtins.setattr", "builtins.delattr", ".__setattr__", ".__delattr__"}):
      names = m.fold_strings(attr) if attr is not None else set()
      for b in m.resolve(obj) if obj is not None else ():
        out.extend((call, f"{b}.{n}", "setattr") for n in sorted(names or {"?"}))
    elif callee & {".setattr", ".delattr", ".setitem", ".delitem", ".setenv", ".delenv"}:
      # monkeypatch-like: setattr("mod.attr", v) or setattr(obj, "attr", v)
      for s in m.fold_strings(obj) if obj is not None else ():
        out.append((call, s, "monkeypatch"))
      for b in m.resolve(obj) if obj is not None else ():
        names = m.fold_strings(attr) if attr is not None else set()
        out.extend((call, f"{b}.{n}", "monkeypatch") for n in sorted(names or {"?"}))
      if callee & {".setenv", ".delenv"}:
        out.append((call, "os.environ[]", "monkeypatch"))
    elif any(matches(c, MOCK_PATCH) for c in callee):
      for s in m.fold_strings(obj) if obj is not None else ():
        out.append((call, s, "mock.patch"))
      for b in m.resolve(obj) if obj is not None else ():
        names = m.fold_strings(attr) if attr is not None else set()
        out.extend((call, f"{b}.{n}" if names else b, "mock.patch") for n in sorted(names or {""}))
    elif isinstance(call.func, ast.Attribute) and nfkc(call.func.attr) in MUTATORS:
      # A module's attribute (sys.path, os.environ), not a module function (os.remove) nor
      # a builtin type's method called on an instance (dict.update(self, ...)).
      out.extend(
        (call, b, "mutating call")
        for b in sorted(m.resolve(call.func.value))
        if "." in b and not (b.startswith("builtins.") and is_type(b[9:]))
      )
    elif callee & {"os.putenv", "os.unsetenv"}:
      out.append((call, "os.environ[]", "putenv"))
  return out


def is_type(name: str) -> bool:
  return isinstance(getattr(builtins, name, None), type)
