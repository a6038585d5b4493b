"""Per-grade rewriting of the hidden FAIL_TO_PASS tests, so that no outcome the candidate's
process reports decides a grade on its own (host side; the sandbox half is in harness.py).

Every FAIL_TO_PASS test function the grader can locate (module level or a method of a
module-level class of its file, defined once, not a generator or coroutine) is rewritten in
the graded copy of its file, fresh for every grade:

- **renamed**: a random token goes inside its name (`test_hypot` -> `test_k3q9_hypot`;
  prefix and suffix patterns such as `test*` / `*_test` still match), so the names the
  problem statement lists exist nowhere in the run. Collected ids are mapped back here. A
  name the file uses again, or that ids of another file run (a class imported or inherited
  there), is kept: such a function is protected by hidden sites alone.
- **hidden sites**: each `assert A == <literal>` (either side; `unittest`'s assertEqual
  family; `pytest.approx(<literal>, rel=..., abs=...)`) that is not inside try/with or a
  nested scope becomes `S(id, A)`: the harness sends A as plain data and the host compares it
  with the literal, which is not in the sandbox at all. A site that is a top-level statement
  before any `return` is *required*: a run of the test that did not report it failed.
  Expected values that are not in the process cannot be read, lied to or forged.
- **decoys**: a function without a required site gets `k` copies under other random names
  whose expected values are perturbed (parametrize columns, literal-bound locals, fixtures
  compared with `==`), or, when no perturbed comparison is reached for sure, whose body ends in
  `finally: raise`. A correct solution fails every decoy; a decoy passes only if outcomes are
  forced (runner tampering), values compare equal to anything, or the expected value was read at
  run time (it reads the decoy's perturbed one): any passing decoy means tampering.

Line numbers of the original code do not move: renames and sites are spliced in place (sites
pad with newlines inside their parentheses) and decoys are appended at the end of the file;
the harness orders each decoy's items next to its twin's.

A function is protected when its pass is judged by what the process cannot know: required
hidden sites, or a rename plus decoys. Every other FAIL_TO_PASS function (not located, defined
twice, a generator, a kept name without a hidden value, no decoy) is listed in
`Plan.unprotected` with why; the grader refuses to grade such a task and the factory never
emits one (grader.unprotected), since its pass would be the candidate's process's word alone.
"""

import ast
import copy
import dataclasses
import random
import re
import secrets

from composer_jax.envs.coding.sandbox.harness import perturb, plain

# unittest assertions that mean `first == second`.
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
_APPROX_KW = frozenset({"rel", "abs", "nan_ok"})


@dataclasses.dataclass(frozen=True)
class Site:
  """A hidden expected value: `literal` (plain data), compared with == or pytest.approx; for
  a parametrized one (`table`), the value is that of the row whose token the record sends."""

  literal: object
  approx: tuple[tuple[str, object], ...] | None  # approx keyword arguments; None: ==
  where: str  # file:line, for messages
  table: bool = False


@dataclasses.dataclass
class Plan:
  """What a grade's rewriting did (host side only; the harness gets `harness_config()`)."""

  files: dict[str, bytes]  # rewritten test files: path -> new source
  names: dict[str, str]  # renamed real test function -> original name
  decoys: dict[str, str]  # decoy function -> its twin (the renamed real function)
  before: dict[str, bool]  # decoy ordered before its twin's items (else after)
  sites: dict[int, Site]
  required: dict[str, tuple[int, ...]]  # function (file::chain::name) -> its required sites
  helper: str  # module name the harness registers the site/decoy helpers under
  unprotected: dict[str, str]  # F2P function (file::chain) -> why it was left as it is
  ids: dict[str, str] = dataclasses.field(default_factory=dict)  # test id -> id as renamed
  decoy_ids: list[str] = dataclasses.field(default_factory=list)  # decoy functions' ids
  back: dict[str, str] = dataclasses.field(default_factory=dict)  # renamed table row -> id
  tokens: dict[str, tuple] = dataclasses.field(default_factory=dict)  # token -> (ids, value)
  owner: dict[str, str] = dataclasses.field(default_factory=dict)  # test id -> its function

  def harness_config(self) -> dict:
    return {"helper": self.helper, "decoys": self.decoys, "before": self.before}

  def run_ids(self, ids: list[str]) -> list[str]:
    """The node ids to run for test ids `ids`: renamed ones under their new names, and the
    decoys."""
    return [self.ids.get(i, i) for i in ids] + self.decoy_ids

  def split(self, nodeid: str) -> tuple[str, str, str]:
    """('real'|'decoy'|'other', id with original names, function name as collected)."""
    head, func, params = split_id(nodeid)
    if nodeid in self.back:
      return "real", self.back[nodeid], func
    if func in self.names:
      return "real", head + self.names[func] + params, func
    if func in self.decoys:
      return "decoy", nodeid, func
    return "other", nodeid, func


def split_id(nodeid: str) -> tuple[str, str, str]:
  """'f.py::C::test_x[a::b]' -> ('f.py::C::', 'test_x', '[a::b]')."""
  file, sep, rest = nodeid.partition("::")
  bracket = rest.find("[")
  names, params = (rest, "") if bracket < 0 else (rest[:bracket], rest[bracket:])
  chain, _, func = names.rpartition("::")
  return file + sep + (chain + "::" if chain else ""), func, params


def renamed(name: str, token: str) -> str:
  """`name` with `token` inside, keeping its first and last word (pytest name patterns)."""
  if name.startswith("test"):
    rest = name[4:]
    return f"test_{token}" + ("" if not rest else rest if rest.startswith("_") else "_" + rest)
  head, sep, tail = name.partition("_")
  return f"{head}_{token}_{tail}" if sep else f"{name}_{token}"


# -- perturbation ---------------------------------------------------------------------------


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


def _approx(node):
  """(literal, kwargs) for `approx(<literal>, rel=<lit>, abs=<lit>)`, else None."""
  if not isinstance(node, ast.Call) or len(node.args) != 1:
    return None
  f = node.func
  name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
  if name != "approx":
    return None
  ok, value = literal(node.args[0])
  if not ok or any(k.arg not in _APPROX_KW for k in node.keywords):
    return None
  kwargs = []
  for k in node.keywords:
    kok, kv = literal(k.value)
    if not kok:
      return None
    kwargs.append((k.arg, kv))
  return value, tuple(sorted(kwargs))


# -- locating and reading test functions ----------------------------------------------------


def _nested_scopes(node):
  """Every node inside `node` except what nested functions, classes and lambdas contain."""
  todo = list(ast.iter_child_nodes(node))
  while todo:
    n = todo.pop()
    yield n
    if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
      todo.extend(ast.iter_child_nodes(n))


def _find(tree: ast.Module, chain: list[str], func: str):
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


def _why_not(fn, defs) -> str:
  """'' if `fn` can be rewritten, else why not."""
  if len(defs) != 1:
    return "defined more than once"
  if isinstance(fn, ast.AsyncFunctionDef):
    return "a coroutine"
  if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in _nested_scopes(fn)):
    return "a generator"
  return ""


def _name_uses(tree: ast.Module, fn) -> int:
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


def _owner(tree: ast.Module, file: str, tid: str) -> str | None:
  """The key (file::defining chain::name) of the function test id `tid` of `file` runs."""
  _, chain, func = _parts(tid)
  found = _find(tree, list(chain), func)
  return None if found is None else _key(file, found[0], func)


def _comparison(stmt):
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


def _expected(left, right):
  """(actual node, Site-like (literal, approx)) when exactly one side is an expected value."""
  for actual, exp in ((left, right), (right, left)):
    ok, value = literal(exp)
    if ok and not literal(actual)[0] and _approx(actual) is None:
      return actual, (value, None)
    ap = _approx(exp)
    if ap is not None and not literal(actual)[0]:
      return actual, ap
  return None


def _statements(body, top=True):
  """(stmt, top-level?, reached-for-sure?) for statements outside try/with/nested scopes."""
  returned = False
  for stmt in body:
    yield stmt, top, top and not returned
    if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.If)):
      yield from _statements(stmt.body, False)
      yield from _statements(stmt.orelse, False)
    if any(isinstance(n, ast.Return) for n in [stmt, *_nested_scopes(stmt)]):
      returned = True


# -- the plan -------------------------------------------------------------------------------


class _Splices:
  """Byte-range replacements in one source (ast offsets are UTF-8 byte columns)."""

  def __init__(self, src: bytes):
    self.src, self.edits = src, []
    self.starts = [0]
    for line in src.splitlines(keepends=True):
      self.starts.append(self.starts[-1] + len(line))

  def offset(self, line: int, col: int) -> int:
    return self.starts[line - 1] + col

  def span(self, node) -> tuple[int, int]:
    return (
      self.offset(node.lineno, node.col_offset),
      self.offset(node.end_lineno, node.end_col_offset),
    )

  def text(self, node) -> bytes:
    a, b = self.span(node)
    return self.src[a:b]

  def replace(self, a: int, b: int, new: bytes) -> None:
    self.edits.append((a, b, new))

  def apply(self) -> bytes:
    out, end = self.src, None
    for a, b, new in sorted(self.edits, reverse=True):
      if end is not None and b > end:
        raise ValueError("overlapping rewrites")
      out, end = out[:a] + new + out[b:], a
    return out


def _ident(rng: random.Random) -> str:
  return "_" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(7))


def _parts(tid: str) -> tuple[str, tuple[str, ...], str]:
  head, func, _ = split_id(tid)
  file, _, chain = head.rstrip(":").partition("::")
  return file, tuple(chain.split("::")) if chain else (), func


def plan(
  files: dict[str, bytes],
  f2p: list[str],
  ids: list[str] = (),
  *,
  k: int = 1,
  rng: random.Random | None = None,
) -> Plan:
  """Rewrites the test files of `f2p` (`files`: path -> source, those of `f2p` and of `ids`)
  for one grade (module docstring). `ids`: every test id the grade runs (FAIL_TO_PASS and
  PASS_TO_PASS), renamed where their function is."""
  rng = rng or random.Random(secrets.randbits(64))
  p = Plan({}, {}, {}, {}, {}, {}, _ident(rng), {})
  by_file: dict[str, dict[tuple, list]] = {}
  for tid in f2p:
    file, chain, func = _parts(tid)
    by_file.setdefault(file, {}).setdefault((chain, func), []).append(tid)
  others: dict[str, list[str]] = {}
  for tid in sorted(set(ids) | set(f2p)):
    others.setdefault(_parts(tid)[0], []).append(tid)
  # Functions run under ids of a file that does not define them (a test class imported or
  # inherited from another file): a rename elsewhere would leave such an id naming nothing.
  foreign: dict[str, set[str]] = {}
  for file, tids in others.items():
    tree = _parse(files.get(file))
    for tid in tids:
      _, chain, func = _parts(tid)
      if tree is None or _find(tree, list(chain), func) is None:
        foreign.setdefault(func, set()).add(file)
  used: set[str] = set()
  for file, funcs in sorted(by_file.items()):
    src = files.get(file)
    if src is None:
      for chain, func in funcs:
        p.unprotected[_key(file, chain, func)] = "not a test file of the task"
      continue
    elsewhere = {f for f, where in foreign.items() if where - {file}}
    _rewrite(p, file, src, funcs, k, rng, used, others.get(file, []), elsewhere)
  return p


def _parse(src: bytes | None) -> ast.Module | None:
  try:
    return None if src is None else ast.parse(src)
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return None


def _key(file, chain, func) -> str:
  return "::".join([file, *chain, func])


def _rewrite(p: Plan, file: str, src: bytes, funcs, k: int, rng, used: set, ids, elsewhere) -> None:
  tree = _parse(src)
  if tree is None:
    for chain, func in funcs:
      p.unprotected[_key(file, chain, func)] = "the file does not parse"
    return
  sp = _Splices(src)
  names = {_ident(rng) for _ in range(3)}
  S, R, P = sorted(names) if len(names) == 3 else (_ident(rng), _ident(rng), _ident(rng))
  tail_funcs: list[tuple[tuple[str, ...], str]] = []  # (class chain, decoy source)
  tail_tables: list[str] = []
  done = {}  # (defining chain, name) -> new name
  for chain, func in sorted(funcs):
    found = _find(tree, list(chain), func)
    if found is None:
      p.unprotected[_key(file, chain, func)] = "definition not found in the file"
      continue
    where, defs = found
    fn = defs[0]
    if (tuple(where), func) in done:
      new = done[(tuple(where), func)]
      p.decoy_ids += ["::".join([file, *chain, d]) for d, twin in p.decoys.items() if twin == new]
      continue
    if why := _why_not(fn, defs):
      p.unprotected[_key(file, chain, func)] = why
      continue
    # A name the file uses again, or that ids of another file run (a class imported or
    # inherited there), is kept: renaming would break those references. Such a function is
    # protected only by hidden expected values (decoys need the real test renamed).
    uses = _name_uses(tree, fn)
    kept = (
      "also run in another file (imported or inherited)"
      if func in elsewhere
      else f"its name is used {uses} more times in the file"
      if uses
      else ""
    )
    new = func if kept else _fresh(func, rng, used)
    fkey = _key(file, where, func)
    owned = [t for t in ids if _owner(tree, file, t) == fkey]
    if not kept:
      a = sp.offset(fn.lineno, fn.col_offset)
      line_end = sp.starts[fn.lineno] if fn.lineno < len(sp.starts) else len(src)
      m = re.compile(rb"(async\s+)?def\s+" + re.escape(func.encode()) + rb"\b").search(
        src, a, line_end
      )
      if m is None:
        p.unprotected[_key(file, chain, func)] = "def line not found"
        continue
      p.names[new] = func
      sp.replace(m.end() - len(func.encode()), m.end(), new.encode())
    done[(tuple(where), func)] = new
    required = []
    for stmt, _, sure in _statements(fn.body):
      cmp = _comparison(stmt)
      exp = _expected(*cmp) if cmp else None
      if exp is None:
        continue
      actual, (value, approx) = exp
      sid = len(p.sites) + 1
      p.sites[sid] = Site(value, approx, f"{file}:{stmt.lineno}")
      if sure:
        required.append(sid)
      a0, b0 = sp.span(stmt)
      body = sp.text(actual)
      pad = b"\n" * (stmt.end_lineno - stmt.lineno - body.count(b"\n"))
      sp.replace(a0, b0, f"{S}({sid}, (".encode() + body + pad + b"))")
    if not required and func not in elsewhere:  # another file's ids would lose their rows
      required = _hide_table(p, fn, tree, sp, file, new, S, rng, owned)
    if required:
      p.required[fkey] = tuple(required)
      continue
    if kept:
      p.unprotected[_key(file, chain, func)] = f"{kept}; no expected value to hide"
      del done[(tuple(where), func)]
      continue
    tables = []
    for i in range(k + 1):
      if i == k and not tables:
        break  # a second decoy only for a shared table: its copies go before and after it
      try:
        decoy = _decoy(fn, tree, _fresh(func, rng, used), R, P, rng, tables)
      except ValueError as e:  # a perturbed literal that has no source text
        p.unprotected[_key(file, chain, func)] = f"no decoy: {e}"
        break
      p.decoys[decoy.name] = new
      p.before[decoy.name] = rng.random() < 0.5
      p.decoy_ids.append("::".join([file, *chain, decoy.name]))
      tail_funcs.append((tuple(where), ast.unparse(decoy)))
    for i, (table, text, bound) in enumerate(tables):
      if i % 2 == 0:  # before the original in the module's namespace, on its first line
        at = sp.offset(bound.lineno, bound.col_offset)
        sp.replace(at, at, f"{table} = {text}; ".encode())
      else:
        tail_tables.append(f"{table} = {text}")
  # A sentinel: a test that fails whatever the candidate wrote, named like one of the file's
  # FAIL_TO_PASS tests and run beside it. Outcomes forced for every test (a plugin, a patched
  # report) make it pass, even where no function of the file could be rewritten.
  chain, func = sorted(funcs)[int(rng.random() * len(funcs))]
  twin = done.get((chain, func), func)
  name = _fresh(func, rng, used)
  a = rng.randrange(1 << 40)
  tail_funcs.append(((), f"def {name}():\n    assert {a} == {a + rng.randrange(1, 1 << 20)}"))
  p.decoys[name] = twin
  p.before[name] = rng.random() < 0.5
  p.decoy_ids.append(f"{file}::{name}")
  for tid in ids:  # every id whose function was rewritten (inherited methods too)
    _, chain, func = _parts(tid)
    found = _find(tree, list(chain), func)
    if found and (tuple(found[0]), func) in done:
      p.owner[tid] = _key(file, found[0], func)
      if tid not in p.ids:
        head, _, params = split_id(tid)
        p.ids[tid] = head + done[(tuple(found[0]), func)] + params
  tail = [
    "",
    f"import {p.helper} as {P}_h",
    f"{S} = {P}_h.site",
    f"{R} = {P}_h.rows",
    f"{P} = {P}_h.perturb",
    f"del {P}_h",
    *tail_tables,
  ]
  for chain, code in tail_funcs:
    if not chain:
      tail.append(code)
      continue
    keep = _ident(rng)
    tail.append(f"{keep} = {chain[0]}")
    wrapper = "".join(f"{'  ' * i}class {c}:\n" for i, c in enumerate(chain))
    body = "\n".join("  " * len(chain) + ln for ln in code.splitlines())
    tail.append(wrapper + body)
    name = ast.parse(code).body[0].name
    owner = ".".join([keep, *chain[1:]])
    tail.append(f"{owner}.{name} = {'.'.join(chain)}.__dict__[{name!r}]")
    tail.append(f"{chain[0]} = {keep}")
    tail.append(f"del {keep}")
  end = b"" if src.endswith(b"\n") or not src else b"\n"
  p.files[file] = sp.apply() + end + "\n".join(tail).encode() + b"\n"


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


def _hide_table(p: Plan, fn, tree, sp: _Splices, file: str, new: str, S: str, rng, ids):
  """Hides a parametrized expected value of `fn` (module docstring), whose test ids are `ids`:
  returns the required site ids, or [] when the test's shape does not allow it."""
  params = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
  decs = [(d, _parametrize(d)) for d in fn.decorator_list]
  decs = [(d, pz) for d, pz in decs if pz is not None]
  if len(decs) != 1 or any(
    _parametrize(d) is None and _is_parametrize(d) for d in fn.decorator_list
  ):
    return []
  dec, (argnames, values) = decs[0]
  kw = {k.arg: k.value for k in dec.keywords}
  ids_list = None
  if "ids" in kw:
    ok, ids_list = literal(kw["ids"])
    if not ok or not isinstance(ids_list, (list, tuple)):
      return []
  if set(kw) - {"ids", "argnames", "argvalues"}:
    return []
  # The expected-value parameter: compared with == (or approx) at top level, nowhere else.
  hits = {}
  for stmt, _, sure in _statements(fn.body):
    cmp = _comparison(stmt)
    if cmp is None:
      continue
    for actual, exp in (cmp, cmp[::-1]):
      name, approx = exp, None
      if isinstance(exp, ast.Call) and len(exp.args) == 1 and _approx_name(exp):
        kwargs = [(k.arg, literal(k.value)) for k in exp.keywords]
        if any(a not in _APPROX_KW or not ok for a, (ok, _) in kwargs):
          continue
        name, approx = exp.args[0], tuple(sorted((a, v) for a, (_, v) in kwargs))
      if isinstance(name, ast.Name) and name.id in params and name.id in argnames:
        if not literal(actual)[0] and sure:
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
    ok, rows = literal(table)
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
      by_param.setdefault(split_id(t)[2][1:-1], []).append(t)
    if set(by_param) != set(orig):
      continue
    for cell, tok in zip(cells, tokens):
      a, b = sp.span(cell)
      sp.replace(a, b, f"{tok!r}".encode() + b"\n" * (cell.end_lineno - cell.lineno))
    value_of = dict(zip(orig, [r if n == 1 else r[col] for r in rows]))
    for param, tok, nid in zip(orig, tokens, newids):
      for t in by_param[param]:
        head, _, _ = split_id(t)
        p.ids[t] = f"{head}{new}[{nid}]"
        p.back[p.ids[t]] = t
      p.tokens[tok] = (tuple(by_param[param]), value_of[param])
    sid = len(p.sites) + 1
    p.sites[sid] = Site(None, uses[0][2], f"{file}:{uses[0][0].lineno}", table=True)
    for stmt, actual, _ in uses:
      a0, b0 = sp.span(stmt)
      body = sp.text(actual)
      pad = b"\n" * (stmt.end_lineno - stmt.lineno - body.count(b"\n"))
      sp.replace(a0, b0, f"{S}({sid}, (".encode() + body + pad + f"), {var})".encode())
    return [sid]
  return []


def _approx_name(call) -> bool:
  f = call.func
  return (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) == "approx"


def _is_parametrize(dec) -> bool:
  f = dec.func if isinstance(dec, ast.Call) else dec
  return (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) == "parametrize"


def _fresh(func: str, rng, used: set) -> str:
  while True:
    token = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(6))
    name = renamed(func, token)
    if name not in used:
      used.add(name)
      return name


# -- decoys ---------------------------------------------------------------------------------


def _parametrize(dec):
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


def _module_literal(tree: ast.Module, node):
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


def _decoy(fn, tree, name: str, R: str, P: str, rng, tables: list):
  """A perturbed copy of test function `fn` named `name` (module docstring), or None. A
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
  top = list(_statements(d.body))
  literal_locals = {}
  for stmt, is_top, _ in top:
    if (
      is_top
      and isinstance(stmt, ast.Assign)
      and len(stmt.targets) == 1
      and isinstance(stmt.targets[0], ast.Name)
      and literal(stmt.value)[0]
    ):
      literal_locals.setdefault(stmt.targets[0].id, []).append(stmt)
  compared, sure_hit, inline = {}, False, []
  for stmt, _, sure in top:
    cmp = _comparison(stmt)
    if cmp is None:
      continue
    exp = _expected(*cmp)
    if exp is not None:  # a non-required site: its literal is perturbed in place
      inline.append((stmt, cmp, exp))
      sure_hit |= sure
      continue
    for side, other in (cmp, cmp[::-1]):
      if isinstance(side, ast.Name) and not literal(other)[0]:
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
      pz = _parametrize(dec)
      if pz is None or var not in pz[0]:
        continue
      names, values = pz
      col = names.index(var)
      ok, rows, bound = _module_literal(tree, values)
      new_rows = None
      if ok and isinstance(rows, (list, tuple)):
        new_rows = _perturb_rows(rows, len(names), [col], rng)
      try:
        repl = _node(new_rows) if new_rows is not None else None
      except ValueError:
        repl = None
      if repl is not None and bound is not None:
        table = _ident(rng)
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
    fail = ast.Raise(ast.Call(ast.Name("AssertionError", ast.Load()), [], []), None)
    d.body = [ast.Try(d.body, [], [], [fail])]
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


def matches(site: Site, expected, views, decode) -> bool:
  """Whether one of `views` (encodings of the actual value, decoded by `decode`) equals
  `expected`: == on plain data, or pytest.approx with the site's arguments."""
  if not isinstance(views, list):
    return False
  for view in views:
    try:
      value = decode(view)
    except (ValueError, TypeError, ArithmeticError, RecursionError):
      continue
    if site.approx is None:
      if value == expected:
        return True
      continue
    import pytest

    try:
      if pytest.approx(expected, **dict(site.approx)) == value:
        return True
    except (TypeError, ValueError):
      continue
  return False
