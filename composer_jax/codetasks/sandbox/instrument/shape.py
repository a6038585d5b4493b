"""Reading a test function's shape (AST): where it is defined, its `==` checks against a
literal expected value (assert, unittest's assertEqual family, pytest.approx), its
parametrize tables, and whether it can be rewritten."""

import ast

from composer_jax.codetasks.sandbox.site_values import plain

EQUALS = frozenset(
  {
    "assertEqual",
    "assertEquals",
    "failUnlessEqual",
    "assertListEqual",
    "assertTupleEqual",
    "assertDictEqual",
    "assertSetEqual",
    "assertSequenceEqual",
    "assertMultiLineEqual",
  }
)


APPROX_KW = frozenset({"rel", "abs", "nan_ok"})


def literal(node):
  """(True, value) if `node` is a literal of plain data, else (False, None)."""
  if isinstance(node, (ast.Name, ast.Attribute, ast.Call)) and not _set_call(node):
    return False, None
  try:
    value = ast.literal_eval(node)
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
    return False, None
  return (True, value) if plain(value) else (False, None)


def _set_call(node) -> bool:
  return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "set"


def approx(node):
  """(literal, kwargs) for `approx(<literal>, rel=<lit>, abs=<lit>)`, else None."""
  if not isinstance(node, ast.Call) or len(node.args) != 1:
    return None
  f = node.func
  name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
  if name != "approx":
    return None
  ok, value = literal(node.args[0])
  if not ok or any(k.arg not in APPROX_KW for k in node.keywords):
    return None
  kwargs = []
  for k in node.keywords:
    kok, kv = literal(k.value)
    if not kok:
      return None
    kwargs.append((k.arg, kv))
  return value, tuple(sorted(kwargs))


def approx_name(call) -> bool:
  f = call.func
  return (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) == "approx"


def nested_scopes(node):
  """Every node inside `node` except what nested functions, classes and lambdas contain."""
  todo = list(ast.iter_child_nodes(node))
  while todo:
    n = todo.pop()
    yield n
    if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
      todo.extend(ast.iter_child_nodes(n))


def find(tree: ast.Module, chain: list[str], func: str):
  """(defining class chain, FunctionDef) of `func` as seen from class `chain`, or None.

  Methods inherited from a base class of the same file are found in that base."""
  classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

  def scope(body, names):
    for name in names:
      node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == name), None)
      if node is None:
        return None
      body = node.body
    return body

  def lookup(path, seen):
    body = scope(tree.body, path)
    if body is None:
      return None
    defs = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    hit = [n for n in defs if n.name == func]
    if hit:
      return path, hit
    if not path:
      return None
    cls = scope(tree.body, path[:-1])
    node = next(n for n in cls if isinstance(n, ast.ClassDef) and n.name == path[-1])
    for base in node.bases:
      if isinstance(base, ast.Name) and base.id in classes and base.id not in seen:
        found = lookup([base.id], seen | {base.id})
        if found:
          return found
    return None

  found = lookup(chain, set(chain[:1]))
  return found


def why_not(fn, defs) -> str:
  """'' if `fn` can be rewritten, else why not."""
  if len(defs) != 1:
    return "defined more than once"
  if isinstance(fn, ast.AsyncFunctionDef):
    return "a coroutine"
  if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in nested_scopes(fn)):
    return "a generator"
  return ""


def name_uses(tree: ast.Module, fn) -> int:
  """How many times the file uses `fn`'s name other than in its own def."""
  uses = 0
  for n in ast.walk(tree):
    if isinstance(n, ast.Name) and n.id == fn.name:
      uses += 1
    elif isinstance(n, ast.Attribute) and n.attr == fn.name:
      uses += 1
    elif isinstance(n, ast.Constant) and n.value == fn.name:
      uses += 1
    elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not fn:
      uses += n.name == fn.name
  return uses


def comparison(stmt):
  """(left, right) of `assert a == b` or `self.assertEqual(a, b)`, else None."""
  if isinstance(stmt, ast.Assert):
    t = stmt.test
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq):
      return t.left, t.comparators[0]
    return None
  if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
    c = stmt.value
    f = c.func
    if (
      isinstance(f, ast.Attribute)
      and f.attr in EQUALS
      and isinstance(f.value, ast.Name)
      and f.value.id == "self"
      and len(c.args) >= 2
      and not any(k.arg not in ("msg", None) for k in c.keywords)
    ):
      return c.args[0], c.args[1]
  return None


def expected(left, right):
  """(actual node, Site-like (literal, approx)) when exactly one side is an expected value."""
  for actual, exp in ((left, right), (right, left)):
    ok, value = literal(exp)
    if ok and not literal(actual)[0] and approx(actual) is None:
      return actual, (value, None)
    ap = approx(exp)
    if ap is not None and not literal(actual)[0]:
      return actual, ap
  return None


def statements(body, top=True):
  """(stmt, top-level?, reached-for-sure?) for statements outside try/with/nested scopes."""
  returned = False
  for stmt in body:
    yield stmt, top, top and not returned
    if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.If)):
      yield from statements(stmt.body, False)
      yield from statements(stmt.orelse, False)
    if any(isinstance(n, ast.Return) for n in [stmt, *nested_scopes(stmt)]):
      returned = True


def parametrize(dec):
  """(argnames, argvalues node, where) of a `@...parametrize(names, values)` decorator."""
  if not isinstance(dec, ast.Call):
    return None
  f = dec.func
  name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
  if name != "parametrize":
    return None
  args = list(dec.args)
  kw = {k.arg: k.value for k in dec.keywords}
  names_node = args[0] if args else kw.get("argnames")
  values_node = args[1] if len(args) > 1 else kw.get("argvalues")
  if names_node is None or values_node is None or "indirect" in kw:
    return None
  ok, names = literal(names_node)
  if not ok:
    return None
  if isinstance(names, str):
    names = [n.strip() for n in names.split(",") if n.strip()]
  if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
    return None
  return list(names), values_node


def is_parametrize(dec) -> bool:
  f = dec.func if isinstance(dec, ast.Call) else dec
  return (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) == "parametrize"


def module_literal(tree: ast.Module, node):
  """(ok, value, the assignment) of the literal bound once at module level to Name `node`
  (an inline literal: no assignment), or (False, None, None)."""
  if not isinstance(node, ast.Name):
    return (*literal(node), None)
  binds = [
    s
    for s in tree.body
    if isinstance(s, ast.Assign)
    and any(isinstance(t, ast.Name) and t.id == node.id for t in s.targets)
  ]
  if len(binds) != 1 or len(binds[0].targets) != 1:
    return False, None, None
  return (*literal(binds[0].value), binds[0])


# Comparisons with a literal other than ==, judged on the host like ==: ast op -> site op.
ORDER_OPS = {
  ast.NotEq: "!=",
  ast.Lt: "<",
  ast.LtE: "<=",
  ast.Gt: ">",
  ast.GtE: ">=",
  ast.In: "in",
  ast.NotIn: "not in",
}
_SINGLETONS = (None, True, False)
_TRUTH_CALLS = {
  "assertTrue": "truthy",
  "failUnless": "truthy",
  "assertFalse": "falsy",
  "failIf": "falsy",
  "assertIsNone": "is",
  "assertIsNotNone": "is not",
}


# Predicates of str/bytes the host evaluates itself on the receiver's reading (and its
# arguments'): `assert s.startswith(p)` is judged without the receiver's own method.
STR_PREDICATES = frozenset(
  {
    "startswith",
    "endswith",
    "isupper",
    "islower",
    "isdigit",
    "isalpha",
    "isalnum",
    "isspace",
    "istitle",
    "isidentifier",
    "isnumeric",
    "isdecimal",
    "isprintable",
    "isascii",
  }
)


def str_predicate(node):
  """(receiver node, method name, argument nodes) of `<x>.<str predicate>(<args>)`, else None."""
  if (
    isinstance(node, ast.Call)
    and isinstance(node.func, ast.Attribute)
    and node.func.attr in STR_PREDICATES
    and not node.keywords
    and not any(isinstance(a, ast.Starred) for a in node.args)
    and len(node.args) <= 3
  ):
    return node.func.value, node.func.attr, node.args
  return None


def _opaque(node) -> bool:
  """Whether `node`'s truth is the value's own answer, not a comparison the candidate's
  rich-comparison methods would decide (a Compare or BoolOp is judged through its parts)."""
  return not isinstance(node, (ast.Compare, ast.BoolOp)) and not literal(node)[0]


def check(stmt):
  """(actual node, (literal, approx, op, literal on the left)) for a check other than `==`
  that the host can judge from the actual value's canonical reading alone: `assert E` /
  `assert not E` (op 'truthy' / 'falsy'), `assert E is [not] None|True|False`, `assert E
  <op> <literal>` (!=, <, <=, >, >=, in, not in, either side), unittest's assertTrue /
  assertFalse / assertIsNone / assertIsNotNone; else None."""
  if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
    c, f = stmt.value, stmt.value.func
    if (
      isinstance(f, ast.Attribute)
      and f.attr in _TRUTH_CALLS
      and isinstance(f.value, ast.Name)
      and f.value.id == "self"
      and c.args
      and not any(k.arg not in ("msg", None) for k in c.keywords)
      and _opaque(c.args[0])
    ):
      op = _TRUTH_CALLS[f.attr]
      return c.args[0], (None, None, op, False)
    return None
  if not isinstance(stmt, ast.Assert):
    return None
  t = stmt.test
  if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) and _opaque(t.operand):
    return t.operand, (None, None, "falsy", False)
  if _opaque(t):
    return t, (None, None, "truthy", False)
  if not isinstance(t, ast.Compare) or len(t.ops) != 1:
    return None
  left, op, right = t.left, t.ops[0], t.comparators[0]
  if isinstance(op, (ast.Is, ast.IsNot)):
    ok, value = literal(right)
    if ok and any(value is s for s in _SINGLETONS) and not literal(left)[0]:
      return left, (value, None, "is" if isinstance(op, ast.Is) else "is not", False)
    return None
  name = ORDER_OPS.get(type(op))
  if name is None:
    return None
  for actual, exp, flipped in ((left, right, False), (right, left, True)):
    ok, value = literal(exp)
    if ok and not literal(actual)[0] and approx(actual) is None:
      return actual, (value, None, name, flipped)
  return None


def literal_locals(fn) -> dict:
  """Locals of test function `fn` bound once, at its top level, to a literal of plain data
  and used nowhere but as one side of `==` checks (`want = "x"; assert f() == want`): name ->
  (its assignment, the literal). Such a check is an `== <literal>` check whose literal can be
  hidden like an inline one (the assignment then binds None)."""
  binds = {}
  for stmt in fn.body:
    if (
      isinstance(stmt, ast.Assign)
      and len(stmt.targets) == 1
      and isinstance(stmt.targets[0], ast.Name)
      and literal(stmt.value)[0]
    ):
      binds.setdefault(stmt.targets[0].id, []).append(stmt)
  compared = {}
  for stmt, _, _ in statements(fn.body):
    cmp = comparison(stmt)
    for side, other in (cmp, cmp[::-1]) if cmp else ():
      if isinstance(side, ast.Name) and not literal(other)[0]:
        compared[side.id] = compared.get(side.id, 0) + 1
  names = [n.id for n in ast.walk(fn) if isinstance(n, ast.Name)]
  return {
    var: (stmts[0], literal(stmts[0].value)[1])
    for var, stmts in binds.items()
    if len(stmts) == 1 and var in compared and names.count(var) == compared[var] + 1
  }
