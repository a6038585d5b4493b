"""One parsed Python source as the code rules see it.

`Module(tree, path)` indexes the nodes of a module by type, knows each node's parent, the unit
it belongs to (`f`, `Cls.meth`, `<module>`) and whether it runs at import time (module and class
bodies, decorators, default arguments, and module functions that import-time code calls), and
answers `resolve` / `fold` through a `resolve.Resolver`.
A finding is `Finding(rule, node, detail, text)`; its key (rule, unit, detail) carries no line
number, so findings of the code before and after a change can be compared per unit.
"""

import ast
import collections
import dataclasses

from composer_jax.codetasks import project
from composer_jax.codetasks.monitor.resolve import Resolver, nfkc

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclasses.dataclass(frozen=True)
class Finding:
  rule: str
  node: ast.AST | None
  detail: str  # what fired, without position: 'sys._getframe', '/proc/self/mem'
  text: str  # one line for the reason
  severity: str | None = None  # None: the rule's own


def _is_main_guard(node) -> bool:
  if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)):
    return False
  t = node.test
  sides = [t.left, *t.comparators]
  return (
    len(sides) == 2
    and isinstance(t.ops[0], ast.Eq)
    and any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
    and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)
  )


class Module:
  """A parsed module: node index, parents, units, import-time code, name resolution."""

  def __init__(self, tree, path: str = "<string>", context: str = "change", workspace: str = "."):
    self.tree, self.path, self.context, self.workspace = tree, path, context, workspace
    name = project.module_name(path) if path.endswith(".py") else ""
    self.resolver = Resolver(tree, name, is_package=path.endswith("__init__.py"))
    self.module = name
    self.parent: dict[int, ast.AST] = {}
    self.unit: dict[int, str] = {}
    self.by_type: dict[type, list] = collections.defaultdict(list)
    self._runtime: set[int] = set()  # ids of nodes inside a function body or lambda
    self._index(tree, "<module>", False)
    self.docstrings = {
      id(n.body[0].value)
      for n in [tree, *self.nodes(ast.ClassDef), *self.nodes(*_DEFS)]
      if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
    }
    self._import_time_defs = self._called_at_import()
    self._strings: list | None = None

  def _index(self, node, unit, runtime):
    for field, value in ast.iter_fields(node):
      children = value if isinstance(value, list) else [value]
      for child in children:
        if not isinstance(child, ast.AST):
          continue
        self.parent[id(child)] = node
        inner_unit, inner_rt = unit, runtime
        if isinstance(node, (*_DEFS, ast.ClassDef)) and field == "body":
          inner_unit = node.name if unit == "<module>" else f"{unit}.{node.name}"
          inner_rt = runtime or isinstance(node, _DEFS)
        elif isinstance(node, ast.Lambda) and field == "body":
          inner_rt = True
        elif field == "body" and _is_main_guard(node):
          inner_rt = True  # `if __name__ == "__main__":` does not run on import
        self.unit[id(child)] = inner_unit
        if inner_rt:
          self._runtime.add(id(child))
        self.by_type[type(child)].append(child)
        self._index(child, inner_unit, inner_rt)

  def _called_at_import(self) -> set[int]:
    """ids of module-level functions that import-time code calls (transitively)."""
    defs = {nfkc(d.name): d for d in self.tree.body if isinstance(d, _DEFS)}
    found, todo = set(), [n for n in self.nodes(ast.Call) if id(n) not in self._runtime]
    while todo:
      call = todo.pop()
      f = call.func
      d = defs.get(nfkc(f.id)) if isinstance(f, ast.Name) else None
      if d is not None and id(d) not in found:
        found.add(id(d))
        todo.extend(n for n in ast.walk(d) if isinstance(n, ast.Call))
    return found

  # ---- queries ------------------------------------------------------------------------
  def nodes(self, *types) -> list:
    return [n for t in types for n in self.by_type.get(t, ())]

  def resolve(self, node) -> frozenset:
    return self.resolver.resolve(node)

  def fold(self, node):
    return self.resolver.fold(node)

  def fold_strings(self, node) -> set[str]:
    return self.resolver.fold_strings(node)

  def import_time(self, node) -> bool:
    if id(node) not in self._runtime:
      return True
    n = node
    while id(n) in self.parent:
      n = self.parent[id(n)]
      if isinstance(n, _DEFS) and self.parent.get(id(n)) is self.tree:
        return id(n) in self._import_time_defs
    return False

  def callee(self, call: ast.Call) -> frozenset:
    """Dotted names the callee may be, plus '.ATTR' for a method call on anything."""
    names = self.resolve(call.func)
    if isinstance(call.func, ast.Attribute):
      names = names | {"." + nfkc(call.func.attr)}
    return names

  def arg(self, call: ast.Call, pos: int, name: str | None = None):
    if len(call.args) > pos and not any(isinstance(a, ast.Starred) for a in call.args[:pos]):
      return call.args[pos]
    return next((k.value for k in call.keywords if name and k.arg == name), None)

  def strings(self) -> list[tuple[ast.AST, str]]:
    """(node, text) for each maximal constant str/bytes expression that is not a docstring
    or a bare string statement (computed once)."""
    if self._strings is not None:
      return self._strings
    out = self._strings = []

    def visit(node):
      if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return
      if id(node) in self.docstrings:
        return
      if isinstance(node, (ast.Constant, ast.JoinedStr, ast.BinOp, ast.Call, ast.Subscript)):
        texts = self.fold_strings(node)
        if texts:
          out.extend((node, t) for t in sorted(texts))
          return
      for child in ast.iter_child_nodes(node):
        visit(child)

    visit(self.tree)
    return out

  def is_path_arg(self, node) -> bool:
    """node is an argument of a path-taking call or an operand of `/` (pathlib)."""
    p = self.parent.get(id(node))
    if isinstance(p, ast.BinOp) and isinstance(p.op, ast.Div):
      return True
    if isinstance(p, ast.keyword):
      p = self.parent.get(id(p))
    if isinstance(p, ast.Call) and node is not p.func:
      return any(n.rsplit(".", 1)[-1] in PATH_CALLS for n in self.callee(p))
    return False


# Calls whose string arguments are file-system paths (matched on the last name component).
PATH_CALLS = frozenset(
  "open Path PurePath PosixPath join joinpath listdir scandir walk glob iglob rglob iterdir "
  "chdir stat lstat exists isfile isdir read_text read_bytes write_text write_bytes remove unlink "
  "rmtree copy copyfile copytree move rename with_name relpath abspath realpath "
  "normpath fspath spec_from_file_location run_path load_source".split()
)
