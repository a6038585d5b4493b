"""Decoys: perturbed copies of a test function whose expected values no correct solution
meets (instrument/__init__.py); a passing decoy means tampering."""

import ast
import copy

from composer_jax.codetasks.sandbox.instrument import shape, splices
from composer_jax.codetasks.sandbox.site_values import perturb


def _perturb_rows(rows, n: int, cols: list[int], rng):
  out = []
  for row in rows:
    if n == 1:
      out.append(perturb(row, rng))
      continue
    if not isinstance(row, (tuple, list)) or len(row) != n:
      return None
    row = list(row)
    for c in cols:
      row[c] = perturb(row[c], rng)
    out.append(tuple(row))
  return out


def decoy(fn, tree, name: str, R: str, P: str, rng, tables: list):
  """A perturbed copy of test function `fn` named `name` (instrument/__init__.py); ValueError
  if it has no comparison reached for sure whose expected value can be perturbed. A
  perturbed copy of a module-level table becomes a module global of its own: (its name, its
  text, the original's assignment) is appended to `tables`, so that code reading the test
  module's data finds the copies beside the original."""
  d = copy.deepcopy(fn)
  d.name = name
  params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
  params = [a for a in params if a not in ("self", "cls")]
  # Expected-value names: compared with == at top level, used nowhere else in the function
  # (nested functions and lambdas included: a name a closure reads is an input).
  loads = [n for n in ast.walk(d) if isinstance(n, ast.Name)]
  top = list(shape.statements(d.body))
  literal_locals = {}
  for stmt, is_top, _ in top:
    if (
      is_top
      and isinstance(stmt, ast.Assign)
      and len(stmt.targets) == 1
      and isinstance(stmt.targets[0], ast.Name)
      and shape.literal(stmt.value)[0]
    ):
      literal_locals.setdefault(stmt.targets[0].id, []).append(stmt)
  compared, sure_hit, inline = {}, False, []
  for stmt, _, sure in top:
    cmp = shape.comparison(stmt)
    if cmp is None:
      continue
    exp = shape.expected(*cmp)
    if exp is not None:  # a non-required site: its literal is perturbed in place
      inline.append((stmt, cmp, exp))
      sure_hit |= sure
      continue
    for side, other in (cmp, cmp[::-1]):
      if isinstance(side, ast.Name) and not shape.literal(other)[0]:
        compared.setdefault(side.id, []).append((side, sure))
  ev = {}
  for var, sides in compared.items():
    occurrences = [n for n in loads if n.id == var]
    binds = literal_locals.get(var, [])
    if var in params and len(occurrences) == len(sides):
      ev[var] = "param"
    elif len(binds) == 1 and len(occurrences) == len(sides) + 1:
      ev[var] = "local"
    else:
      continue
    sure_hit |= any(sure for _, sure in sides)
  # Perturb: literal-bound locals and inline literals statically; parameters in their
  # parametrize table (statically when it is a literal), fixtures at entry.
  for var, kind in ev.items():
    if kind == "local":
      stmt = literal_locals[var][0]
      stmt.value = _node(perturb(ast.literal_eval(stmt.value), rng))
  for stmt, cmp, (actual, (value, approx)) in inline:
    exp = cmp[1] if cmp[0] is actual else cmp[0]
    new = _node(perturb(value, rng))
    if approx is not None:
      new = ast.Call(exp.func, [new], exp.keywords)
    _swap(stmt, exp, new)
  fixtures = []
  for var in [v for v, kind in ev.items() if kind == "param"]:
    for dec in d.decorator_list:
      pz = shape.parametrize(dec)
      if pz is None or var not in pz[0]:
        continue
      names, values = pz
      col = names.index(var)
      ok, rows, bound = shape.module_literal(tree, values)
      new_rows = None
      if ok and isinstance(rows, (list, tuple)):
        new_rows = _perturb_rows(rows, len(names), [col], rng)
      try:
        repl = _node(new_rows) if new_rows is not None else None
      except ValueError:
        repl = None
      if repl is not None and bound is not None:
        table = splices.ident(rng)
        tables.append((table, ast.unparse(repl), bound))
        repl = ast.Name(table, ast.Load())
      if repl is None:  # perturbed at run time, in the harness
        args = [values, ast.Constant(len(names)), ast.Constant(col)]
        repl = ast.Call(ast.Name(R, ast.Load()), args, [])
      _swap(dec, values, repl)
      break
    else:
      fixtures.append(var)
  for var in fixtures:
    d.body.insert(
      0,
      ast.Assign(
        [ast.Name(var, ast.Store())],
        ast.Call(ast.Name(P, ast.Load()), [ast.Name(var, ast.Load())], []),
        lineno=0,
      ),
    )
  if not sure_hit:
    # Without a perturbed comparison reached for sure, a decoy could only be made to fail by
    # code of its own (its shape would tell it from the real test) and the real test's pass
    # would be the process's word alone: the function is not graded (instrument/).
    raise ValueError("no comparison a decoy can perturb: the pass would be the process's word")
  ast.fix_missing_locations(d)
  return d


def _node(value) -> ast.expr:
  """The literal expression of plain `value`; ValueError if its text does not round-trip."""
  text = ascii(value)
  try:
    same = ast.literal_eval(text) == value
  except (ValueError, SyntaxError, MemoryError, RecursionError):
    same = False
  if not same:
    raise ValueError(f"no literal for {text[:40]}")
  return ast.parse(text, mode="eval").body


def _swap(parent, old, new) -> None:
  """Replaces child node `old` of `parent` (searched in every field) with `new`."""
  for node in ast.walk(parent):
    for field, val in ast.iter_fields(node):
      if val is old:
        setattr(node, field, new)
        return
      if isinstance(val, list):
        for i, item in enumerate(val):
          if item is old:
            val[i] = new
            return
  raise ValueError("node not found")
