"""Which definition a test id runs, by Python's class hierarchy over the test modules (the
C3 method resolution order, across files), and whether a test function can be renamed with
every id that runs it where other classes define the same name (rewrite.py).

A test module's classes are known by their syntax trees only. A definition is certain where
the id's own class defines the name; else along the class's MRO when every class on it is a
class of the test modules, bound by a plain import of its module, or a standard-library base
(unittest.TestCase, typing.Protocol, ...) that defines no such name. Anything that could make
the MRO or a method's name differ at run time (a base that is not a name, a metaclass, a class
decorator other than pytest.mark / unittest.skip, `__init_subclass__` / `__getattr__` /
`__getattribute__` on the MRO, a star import, an attribute read or written under a name
computed at run time) makes the answer unknown: the caller keeps the name (fail closed)."""

import abc
import ast
import builtins
import os
import re
import typing
import unittest

from composer_jax.codetasks.sandbox.instrument import record, shape

FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)

# Bases from outside the test modules whose methods are known: the standard library's.
KNOWN = {"unittest": unittest, "typing": typing, "abc": abc, "builtins": builtins}
HOOKS = frozenset({"__init_subclass__", "__getattr__", "__getattribute__"})  # creation, lookup
ATTR_CALLS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
NAMESPACES = frozenset({"vars", "locals", "globals"})


def parts(tid: str) -> tuple[str, tuple[str, ...], str]:
  head, func, _ = record.split_id(tid)
  file, _, chain = head.rstrip(":").partition("::")
  return file, tuple(chain.split("::")) if chain else (), func


def classes(tree: ast.Module) -> dict:
  """Top-level classes of a module: name -> ClassDef (None where the name is defined twice)."""
  out = {}
  for n in tree.body:
    if isinstance(n, ast.ClassDef):
      out[n.name] = None if n.name in out else n
  return out


def resolve(classes: dict, file: str, name: str, skip=None) -> tuple:
  """(file, name) of the class `name` that `file` uses: its own top-level class, else the one
  of that name in the other files; (None, name) when there is none (a class from outside);
  ValueError when it is ambiguous (defined twice, or in several other files)."""
  here = classes.get(file, {})
  if name in here and (file, name) != skip:
    if here[name] is None:
      raise ValueError(name)
    return file, name
  hits = [f for f, cs in classes.items() if f != file and name in cs]
  if len(hits) > 1 or (hits and classes[hits[0]][name] is None):
    raise ValueError(name)
  return (hits[0], name) if hits else (None, name)


def _base_name(b) -> str | None:
  return b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None


def mro(classes: dict, key: tuple, stack: frozenset = frozenset()) -> list:
  """The C3 linearization (Python's method resolution order) of class `key` = (file, name),
  bases resolved by name (resolve); ValueError for a cycle or an order that has none."""
  if key in stack or len(stack) > 64:
    raise ValueError(key)
  node = classes.get(key[0], {}).get(key[1]) if key[0] is not None else None
  bases = [
    resolve(classes, key[0], _base_name(b), skip=key)
    for b in (node.bases if node is not None else ())
    if _base_name(b) is not None
  ]
  seqs = [mro(classes, b, stack | {key}) for b in bases] + [bases]
  out = [key]
  while seqs := [q for q in seqs if q]:
    head = next((q[0] for q in seqs if not any(q[0] in r[1:] for r in seqs)), None)
    if head is None:
      raise ValueError(key)
    out.append(head)
    seqs = [q[1:] if q[0] == head else q for q in seqs]
  return out


def defines(node, func: str) -> bool:
  return node is not None and any(isinstance(n, FUNCS) and n.name == func for n in node.body)


def defined_elsewhere(trees: dict, file: str, chain: tuple, func: str, classes: dict):
  """(file, class chain, name) of the definition among `trees`, other than `file`'s, that id
  `file::chain::func` runs: the one module-level function of that name (imported), or the
  method that class `chain[0]` (defined in `file`, or imported: the one class of that name
  among `trees`) gets by its MRO over its ancestors in `trees`, at any depth and across files;
  None if there is no such one definition."""
  if len(chain) > 1:
    return None
  if not chain:
    hits = [
      other
      for other, t in trees.items()
      if other != file
      and t is not None
      and any(isinstance(n, FUNCS) and n.name == func for n in t.body)
    ]
    return (hits[0], (), func) if len(hits) == 1 else None
  try:
    order = mro(classes, resolve(classes, file, chain[0]))
  except ValueError:
    return None
  for f, name in order:
    if defines(classes.get(f, {}).get(name), func):
      return (f, (name,), func) if f != file else None
  return None


def strings(tree: ast.Module, defs: bool = True):
  """(node, text) for every string a module's syntax tree holds: names of every kind
  (variables, attributes, imports and their aliases, arguments, keywords, globals) and str
  constants, and unless `defs` is False the names functions are defined under and the module
  paths `from` imports read (`from pkg.test_x import C` names a module, never a method)."""
  for n in ast.walk(tree):
    for field in n._fields:
      if not defs and (
        (field == "name" and isinstance(n, FUNCS))
        or (field == "module" and isinstance(n, ast.ImportFrom))
      ):
        continue
      v = getattr(n, field, None)
      for x in v if isinstance(v, list) else (v,):
        if isinstance(x, str):
          yield n, x


def definition(trees: dict, classes: dict, tid: str):
  """(file, class chain, name) of the one definition test id `tid` runs, or why it is not
  known for sure (a str; module docstring)."""
  file, chain, func = parts(tid)
  tree = trees.get(file)
  if tree is None:
    return f"{file} is not a test module that parses"
  if len(chain) != 1:
    found = shape.find(tree, list(chain), func)
    if found and tuple(found[0]) == chain and len(found[1]) == 1:
      return file, chain, func
    return f"{tid}: not defined once in its own scope"
  try:
    order = mro(classes, resolve(classes, file, chain[0]))
  except ValueError as e:
    return f"{tid}: no method resolution order for {chain[0]} ({e})"
  if order[0][0] not in (file, None) and not _imports(
    _bound_module(tree, ast.Name(chain[0])), order[0][0], file
  ):
    return f"{tid}: class {chain[0]} is not bound by a plain import of {order[0][0]}"
  own = classes.get(order[0][0], {}).get(order[0][1])
  if defines(own, func):  # its own class defines it: certain
    return order[0][0], (order[0][1],), func
  for f, name in order:
    node = classes.get(f, {}).get(name) if f is not None else None
    if f is not None and node is None:
      return f"{tid}: class {name} of {f} is not known"
    if f is None:
      continue  # checked where a class of the modules names it as a base (below)
    if why := _static(trees[f], f, node, func, classes):
      return f"{tid}: {why}"
  for f, name in order:
    if f is not None and defines(classes[f][name], func):
      return f, (name,), func
  return f"{tid}: no class on its method resolution order defines it"


def _static(tree: ast.Module, file: str, node: ast.ClassDef, func: str, classes: dict) -> str:
  """'' if class `node` of `file` is what its syntax says (bases bound as resolve() finds
  them, nothing that changes its MRO or names at run time), else why not."""
  where = f"{file}:{node.lineno} class {node.name}"
  if node.keywords:
    return f"{where} has class keywords (a metaclass)"
  for dec in node.decorator_list:
    text = ast.unparse(dec.func if isinstance(dec, ast.Call) else dec)
    if not re.fullmatch(r"(pytest\.mark\.\w+|(unittest\.)?(skip|skipIf|skipUnless))", text):
      return f"{where} has class decorator {text}"
  if hooks := sorted(n.name for n in node.body if isinstance(n, FUNCS) and n.name in HOOKS):
    return f"{where} defines {hooks[0]}"
  for b in node.bases:
    name = _base_name(b)
    if name is None:
      return f"{where} has a dynamic base {ast.unparse(b)[:40]}"
    if (star := _star(tree)) is not None:
      return f"{file}:{star} has a star import"
    try:  # as mro() resolved it: it did not raise there
      target = resolve(classes, file, name, skip=(file, node.name))
    except ValueError:
      return f"{where}: base {name} is ambiguous"
    if target[0] == file:
      continue
    module = _bound_module(tree, b)
    if module is None:
      return f"{where}: base {ast.unparse(b)} is not bound by a plain import"
    if target[0] is None:
      cls = getattr(KNOWN.get(module), name, None)
      if not isinstance(cls, type) or hasattr(cls, func):
        return f"{where}: base {ast.unparse(b)} is from outside the test modules"
    elif not _imports(module, target[0], file):
      return f"{where}: base {ast.unparse(b)} is not the class of {target[0]}"
  return ""


def _imports(module: str | None, path: str, importer: str) -> bool:
  """Whether `module` (as _bound_module spells it) is test file `path` for file `importer`."""
  return module is not None and module.rpartition(".")[2] == _module_name(path, importer, module)


def _star(tree: ast.Module) -> int | None:
  for n in tree.body:
    if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names):
      return n.lineno
  return None


def _bound_module(tree: ast.Module, base) -> str | None:
  """The module base expression `base` takes its class from: `M.C` with `import M`, `C` with
  `from M import C` (not renamed: resolve() looks classes up by name), a class of the module
  itself ('' ), the builtin `object`; None otherwise. Relative modules keep their dots."""
  if isinstance(base, ast.Attribute):
    text = ast.unparse(base.value)
    imported = {
      a.name
      for n in tree.body
      if isinstance(n, ast.Import)
      for a in n.names
      if a.asname in (None, a.name)
    }
    return text if text in imported and text.replace(".", "").isidentifier() else None
  for n in tree.body:
    if isinstance(n, ast.ImportFrom):
      for a in n.names:
        if (a.asname or a.name) == base.id:
          return "." * n.level + (n.module or "") if a.asname in (None, a.name) else None
  return "builtins" if base.id == "object" else None


def _module_name(path: str, importer: str, module: str) -> str:
  """The last component of the module name of test file `path` as `module` (imported in file
  `importer`) would spell it: a package's __init__.py is its directory; `from . import C`
  names the importer's own package."""
  if module.strip(".") == "":
    return "" if os.path.dirname(path) == os.path.dirname(importer) else "?"
  stem = os.path.splitext(os.path.basename(path))[0]
  return os.path.basename(os.path.dirname(path)) if stem == "__init__" else stem


def built_names(tree: ast.Module) -> tuple[int, str] | None:
  """(line, what) of the first place `tree` reaches an attribute or a binding under a name
  computed at run time (getattr & co. with a name that is not a literal, a namespace mapping
  subscripted with one, type() with three arguments, exec/eval/compile, a star import)."""
  if (star := _star(tree)) is not None:
    return star, "a star import"
  fixed = _loop_literals(tree)
  for n in ast.walk(tree):
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
      f, args = n.func.id, n.args
      literal = len(args) >= 2 and (
        _literal_str(args[1]) or isinstance(args[1], ast.Name) and args[1].id in fixed
      )
      if f in ATTR_CALLS and not literal:
        return n.lineno, f"{f} with a computed name"
      if f == "type" and len(args) == 3 or f in ("exec", "eval", "compile", "__import__"):
        return n.lineno, f"{f}()"
    if isinstance(n, ast.Subscript) and not _literal_str(n.slice):
      v = n.value
      if (isinstance(v, ast.Attribute) and v.attr == "__dict__") or (
        isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in NAMESPACES
      ):
        return n.lineno, f"{ast.unparse(v)[:30]}[...] with a computed key"
  return None


def _literal_str(node) -> bool:
  return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _loop_literals(tree: ast.Module) -> set[str]:
  """Variables bound only as `for v in (<str literals>)` targets: each value they take is a
  literal of the source (`for attr in ("cache", "cache_info"): hasattr(f, attr)`)."""
  loops, targets, other = set(), set(), set()
  for n in ast.walk(tree):
    if isinstance(n, (ast.For, ast.comprehension)) and isinstance(n.target, ast.Name):
      it = n.iter
      if isinstance(it, (ast.Tuple, ast.List, ast.Set)) and all(map(_literal_str, it.elts)):
        loops.add(n.target.id)
        targets.add(id(n.target))
  for n in ast.walk(tree):
    if isinstance(n, ast.Name):
      if not isinstance(n.ctx, ast.Load) and id(n) not in targets:
        other.add(n.id)
      continue
    for field in n._fields:  # an argument, an import, a global, ... of that name
      v = getattr(n, field, None)
      other.update(x for x in (v if isinstance(v, list) else (v,)) if isinstance(x, str))
  return loops - other


def rename_blocker(trees: dict, classes: dict, ids, target: tuple, runs: dict) -> tuple:
  """(ids that run `target` = (file, class chain, name), '') when it can be renamed with
  those ids although other definitions share its name (an unrelated class's method, an
  override of it or one it overrides: each keeps its name and its ids), else ([], why).

  Renaming a definition changes what runs only for code that names it: so every id of that
  name must be known to run it or another definition, and the name must occur nowhere in the
  test modules but as the name of a function definition (a call, `super().name`, an
  attribute, an import, a string would reach nothing, or another definition, after the
  rename), and no module those ids and their classes come from may build names at run time.
  `runs`: what the plan's own lookup (shape.find in an id's file, else defined_elsewhere)
  says each id runs; a disagreement is not taken."""
  file, _, func = target
  word = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(func) + r"(?![A-Za-z0-9_])")
  for f, tree in sorted(trees.items()):
    if tree is None:
      return [], f"{f} does not parse"
    for node, text in strings(tree, defs=False):
      if word.search(text):
        line = getattr(node, "lineno", "?")
        return [], f"named other than by a definition at {f}:{line}{_override(tree, node, func)}"
  runners, involved = [], {file}
  for tid in ids:
    if parts(tid)[2] != func:
      continue
    found = definition(trees, classes, tid)
    if isinstance(found, str):
      return [], found
    if runs.get(tid, found) != found:
      return [], f"{tid}: the lookups disagree on what it runs"
    involved |= {parts(tid)[0], found[0]}
    runners += [tid] if found == target else []
  for f in sorted(involved):
    if hit := built_names(trees[f]):
      return [], f"names may be built at run time at {f}:{hit[0]} ({hit[1]})"
  return (runners, "") if runners else ([], "no test id runs it")


def _override(tree: ast.Module, node, func: str) -> str:
  """' (an override calls it by name)' where `node` lies in a function of the same name."""
  for fn in ast.walk(tree):
    if isinstance(fn, FUNCS) and fn.name == func and any(n is node for n in ast.walk(fn)):
      return " (an override of it calls it by name)"
  return ""
