"""Hidden parametrized expected values: the column of a parametrize table a test compares
with `==` becomes random tokens, and the host keeps token -> value (instrument/__init__.py)."""

import ast

from composer_jax.codetasks.sandbox.instrument import record, shape, splices


def _param_ids(argnames, rows, ids) -> list[str] | None:
  """The ids pytest gives the rows of `parametrize(argnames, rows, ids=ids)` (without a
  config's hooks), None if it would not give plain ones."""
  from _pytest.mark.structures import ParameterSet
  from _pytest.python import IdMaker

  try:
    sets = [ParameterSet.extract_from(r, force_tuple=len(argnames) == 1) for r in rows]
    out = IdMaker(argnames, sets, None, ids, None, None).make_unique_parameterset_ids()
  except Exception:  # whatever pytest would refuse, we do not rewrite
    return None
  return out if all(isinstance(i, str) for i in out) else None


def hide(p: record.Plan, fn, tree, sp: splices.Splices, file: str, new: str, S: str, rng, ids):
  """Hides a parametrized expected value of `fn` (instrument/__init__.py), whose test ids are `ids`:
  returns the required site ids, or [] when the test's shape does not allow it."""
  params = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
  decs = [(d, shape.parametrize(d)) for d in fn.decorator_list]
  decs = [(d, pz) for d, pz in decs if pz is not None]
  if len(decs) != 1 or any(
    shape.parametrize(d) is None and shape.is_parametrize(d) for d in fn.decorator_list
  ):
    return []
  dec, (argnames, values) = decs[0]
  kw = {k.arg: k.value for k in dec.keywords}
  ids_list = None
  if "ids" in kw:
    ok, ids_list = shape.literal(kw["ids"])
    if not ok or not isinstance(ids_list, (list, tuple)):
      return []
  if set(kw) - {"ids", "argnames", "argvalues"}:
    return []
  # The expected-value parameter: compared with == (or approx) at top level, nowhere else.
  hits = {}
  for stmt, _, sure in shape.statements(fn.body):
    cmp = shape.comparison(stmt)
    if cmp is None:
      continue
    for actual, exp in (cmp, cmp[::-1]):
      name, approx = exp, None
      if isinstance(exp, ast.Call) and len(exp.args) == 1 and shape.approx_name(exp):
        kwargs = [(k.arg, shape.literal(k.value)) for k in exp.keywords]
        if any(a not in shape.APPROX_KW or not ok for a, (ok, _) in kwargs):
          continue
        name, approx = exp.args[0], tuple(sorted((a, v) for a, (_, v) in kwargs))
      if isinstance(name, ast.Name) and name.id in params and name.id in argnames:
        if not shape.literal(actual)[0] and sure:
          hits.setdefault(name.id, []).append((stmt, actual, approx))
  for var, uses in hits.items():
    loads = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == var]
    if len(loads) != len(uses) or len({u[2] for u in uses}) != 1:
      continue
    table = values
    if isinstance(values, ast.Name):
      binds = [
        s
        for s in tree.body
        if isinstance(s, ast.Assign)
        and len(s.targets) == 1
        and isinstance(s.targets[0], ast.Name)
        and s.targets[0].id == values.id
      ]
      names = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == values.id]
      if len(binds) != 1 or len(names) != 2:
        continue
      table = binds[0].value
    if not isinstance(table, (ast.List, ast.Tuple)) or not table.elts:
      continue
    ok, rows = shape.literal(table)
    if not ok:
      continue
    col, n = argnames.index(var), len(argnames)
    if n > 1 and not all(
      isinstance(r, (ast.Tuple, ast.List)) and len(r.elts) == n for r in table.elts
    ):
      continue
    cells = [r if n == 1 else r.elts[col] for r in table.elts]
    orig = _param_ids(argnames, rows, ids_list)
    tokens = [f"cj{rng.getrandbits(50):013x}" for _ in rows]
    swapped = [
      tok if n == 1 else tuple(tok if i == col else v for i, v in enumerate(r))
      for r, tok in zip(rows, tokens)
    ]
    newids = _param_ids(argnames, swapped, ids_list)
    if orig is None or newids is None:
      continue
    mine = list(ids)
    by_param = {}
    for t in mine:
      by_param.setdefault(record.split_id(t)[2][1:-1], []).append(t)
    if set(by_param) != set(orig):
      continue
    for cell, tok in zip(cells, tokens):
      a, b = sp.span(cell)
      sp.replace(a, b, f"{tok!r}".encode() + b"\n" * (cell.end_lineno - cell.lineno))
    value_of = dict(zip(orig, [r if n == 1 else r[col] for r in rows]))
    for param, tok, nid in zip(orig, tokens, newids):
      for t in by_param[param]:
        head, _, _ = record.split_id(t)
        p.ids[t] = f"{head}{new}[{nid}]"
        p.back[p.ids[t]] = t
      p.tokens[tok] = (tuple(by_param[param]), value_of[param])
    sid = len(p.sites) + 1
    p.sites[sid] = record.Site(None, uses[0][2], f"{file}:{uses[0][0].lineno}", table=True)
    for stmt, actual, _ in uses:
      a0, b0 = sp.span(stmt)
      body = sp.text(actual)
      pad = b"\n" * (stmt.end_lineno - stmt.lineno - body.count(b"\n"))
      sp.replace(a0, b0, f"{S}({sid}, (".encode() + body + pad + f"), {var})".encode())
    return [sid]
  return []
