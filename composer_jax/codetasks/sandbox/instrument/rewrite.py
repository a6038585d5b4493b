"""The rewriting of one grade (instrument/__init__.py): which FAIL_TO_PASS functions get
renamed, hidden sites or tables, decoys and sentinels, and which stay unprotected (why)."""

import ast
import random
import re
import secrets

from composer_jax.codetasks.sandbox.instrument import (
  decoys,
  hidden_tables,
  hierarchy,
  record,
  shape,
  splices,
)
from composer_jax.codetasks.sandbox.instrument.hierarchy import parts


def plan(
  files: dict[str, bytes],
  f2p: list[str],
  ids: list[str] = (),
  *,
  k: int = 1,
  rng: random.Random | None = None,
) -> record.Plan:
  """Rewrites the test files of `f2p` (`files`: path -> source, those of `f2p` and of `ids`,
  and modules beside them where a test they import or inherit may be defined) for one grade
  (instrument/__init__.py). `ids`: every test id the grade runs (FAIL_TO_PASS and
  PASS_TO_PASS), renamed where their function is."""
  rng = rng or random.Random(secrets.randbits(64))
  p = record.Plan({}, {}, {}, {}, {}, splices.ident(rng), {}, order_key=rng.getrandbits(64))
  by_file: dict[str, dict[tuple, list]] = {}
  for tid in f2p:
    file, chain, func = parts(tid)
    by_file.setdefault(file, {}).setdefault((chain, func), []).append(tid)
  others: dict[str, list[str]] = {}
  for tid in sorted(set(ids) | set(f2p)):
    others.setdefault(parts(tid)[0], []).append(tid)
  # Functions run under ids of a file that does not define them (a test class imported or
  # inherited from another file): a rename where they are defined must rename those ids too.
  trees = {file: _parse(src) for file, src in files.items()}
  classes = {f: hierarchy.classes(t) for f, t in trees.items() if t is not None}
  foreign: dict[str, set[str]] = {}
  runs: dict[str, tuple | None] = {}  # such an id -> the definition it runs (None: unknown)
  lookup: dict[str, tuple | None] = {}  # every id -> the definition the plan takes it to run
  for file, tids in others.items():
    tree = trees.get(file)
    for tid in tids:
      _, chain, func = parts(tid)
      found = tree and shape.find(tree, list(chain), func)
      if found:
        lookup[tid] = (file, tuple(found[0]), func)
      else:
        foreign.setdefault(func, set()).add(file)
        runs[tid] = tree and hierarchy.defined_elsewhere(trees, file, chain, func, classes)
        lookup[tid] = runs[tid]
  scope = (trees, classes, sorted(lookup), lookup)
  # Such a FAIL_TO_PASS function, when its definition among `files` is found, is rewritten
  # where it is defined.
  moved: dict[str, tuple[str, tuple, str]] = {}  # id -> (file, class chain, name) defining it
  defs: dict[str, dict[tuple, list]] = {}
  for tid in f2p:
    if hit := runs.get(tid):
      moved[tid] = hit
      defs.setdefault(hit[0], {}).setdefault(hit[1:], []).append(tid)
  used: set[str] = set()
  for file in sorted(set(by_file) | set(defs)):
    funcs = {**by_file.get(file, {}), **defs.get(file, {})}
    src = files.get(file)
    if src is None:
      for chain, func in funcs:
        p.unprotected[key(file, chain, func)] = "not a test file of the task"
      continue
    elsewhere = {f for f, where in foreign.items() if where - {file}}
    ids_here = others.get(file, [])
    # Another file's ids run this file's definition: renamed with them (for decoys) where
    # nothing else could name it (_renamable), or where only definitions share its name
    # (hierarchy.rename_blocker, given `scope`).
    away = {t: hit for t, hit in runs.items() if hit and hit[0] == file}
    movable = {f for f in elsewhere if _renamable(f, file, trees, runs, away)}
    _rewrite(
      p,
      file,
      src,
      funcs,
      k,
      rng,
      used,
      ids_here,
      elsewhere,
      away,
      movable,
      scope,
      sentinel=file in by_file,
    )
  for tid, (file, chain, func) in moved.items():
    mine, there = key(*parts(tid)), key(file, chain, func)
    if there in p.required or (there not in p.unprotected and p.ids.get(tid, tid) != tid):
      p.owner[tid] = there
      p.unprotected.pop(mine, None)
    else:
      why = p.unprotected.get(there) or "no expected value to hide"
      p.unprotected[mine] = f"defined in {file}: {why}"
  # Listed under their ids; under their definitions only where those are ids too.
  listed = {key(file, *cf) for file, funcs in by_file.items() for cf in funcs}
  for hit in set(moved.values()):
    if key(*hit) not in listed:
      p.unprotected.pop(key(*hit), None)
  return p


def _renamable(func: str, file: str, trees: dict, runs: dict, away: dict) -> bool:
  """Whether `file`'s test function `func`, run by ids of other files, can be renamed with
  them: every such id of that name runs `file`'s definition (`away`), and no other file names
  it anywhere (an import, an override, a call, an argument, a string: after a rename it would
  name nothing)."""
  for tid, hit in runs.items():
    if parts(tid)[2] == func and (hit is None or tid not in away):
      return False
  word = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(func) + r"(?![A-Za-z0-9_])")
  return all(
    t is not None and not any(word.search(text) for _, text in hierarchy.strings(t))
    for f, t in trees.items()
    if f != file
  )


def _parse(src: bytes | None) -> ast.Module | None:
  try:
    return None if src is None else ast.parse(src)
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return None


def key(file, chain, func) -> str:
  return "::".join([file, *chain, func])


def _owner(tree: ast.Module, file: str, tid: str) -> str | None:
  """The key (file::defining chain::name) of the function test id `tid` of `file` runs."""
  _, chain, func = parts(tid)
  found = shape.find(tree, list(chain), func)
  return None if found is None else key(file, found[0], func)


def _rewrite(
  p: record.Plan,
  file: str,
  src: bytes,
  funcs,
  k: int,
  rng,
  used: set,
  ids,
  elsewhere,
  away=None,
  movable=frozenset(),
  scope=None,
  *,
  sentinel: bool = True,
) -> None:
  tree = _parse(src)
  if tree is None:
    for chain, func in funcs:
      p.unprotected[key(file, chain, func)] = "the file does not parse"
    return
  sp = splices.Splices(src)
  names = {splices.ident(rng) for _ in range(3)}
  S, R, P = (
    sorted(names)
    if len(names) == 3
    else (splices.ident(rng), splices.ident(rng), splices.ident(rng))
  )
  tail_funcs: list[tuple[tuple[str, ...], str]] = []  # (class chain, decoy source)
  tail_tables: list[str] = []
  done = {}  # (defining chain, name) -> new name
  for chain, func in sorted(funcs):
    found = shape.find(tree, list(chain), func)
    if found is None:
      p.unprotected[key(file, chain, func)] = "definition not found in the file"
      continue
    where, defs = found
    fn = defs[0]
    if (tuple(where), func) in done:
      new = done[(tuple(where), func)]
      mine = ["::".join([file, *chain, d]) for d, twin in p.decoys.items() if twin == new]
      p.decoy_ids += [d for d in mine if d not in p.decoy_ids]
      continue
    if why := shape.why_not(fn, defs):
      p.unprotected[key(file, chain, func)] = why
      continue
    # A name the file uses again, or that ids of another file run (a class imported or
    # inherited there), is kept where it has hidden expected values: a rename would break
    # those references. Without them (decoys need the real test renamed), one that only
    # other files' ids run is renamed with them (`movable`, below); else it is unprotected.
    uses = shape.name_uses(tree, fn)
    kept = (
      "also run in another file (imported or inherited)"
      if func in elsewhere
      else f"its name is used {uses} more times in the file"
      if uses
      else ""
    )
    new = func if kept else _fresh(func, rng, used)
    fkey = key(file, where, func)
    owned = [t for t in ids if _owner(tree, file, t) == fkey]
    if not kept:
      if not _rename(p, sp, src, fn, new):
        p.unprotected[key(file, chain, func)] = "def line not found"
        continue
    done[(tuple(where), func)] = new
    required = []
    bound = shape.literal_locals(fn)  # `want = <literal>` used only in == checks
    for stmt, _, sure in shape.statements(fn.body):
      cmp = shape.comparison(stmt)
      exp = shape.expected(*cmp) if cmp else None
      local = cmp and next((n for n in cmp if isinstance(n, ast.Name) and n.id in bound), None)
      if exp is not None:
        actual, (value, approx) = exp
        op, flipped = "==", False
      elif local is not None:
        actual = cmp[1] if cmp[0] is local else cmp[0]
        (value, approx), op, flipped = (bound[local.id][1], None), "==", False
      elif found := shape.check(stmt):  # truth, identity, order: judged like ==
        actual, (value, approx, op, flipped) = found
      else:
        continue
      # `x.startswith(p)`: the receiver and arguments are read, the host calls str's own.
      pred = shape.str_predicate(actual) if op in ("truthy", "falsy") else None
      sid = len(p.sites) + 1
      p.sites[sid] = record.Site(
        value, approx, f"{file}:{stmt.lineno}", op=op, flipped=flipped, method=pred and pred[1]
      )
      if sure:
        required.append(sid)
      a0, b0 = sp.span(stmt)
      body = sp.text(actual)
      if pred:
        args = b"".join(b"(" + sp.text(a) + b"), " for a in pred[2])
        body = sp.text(pred[0]) + b"), args=(" + args  # S(sid, (x), args=((a), )) below
      pad = b"\n" * (stmt.end_lineno - stmt.lineno - body.count(b"\n"))
      sp.replace(a0, b0, f"{S}({sid}, (".encode() + body + pad + b"))")
    for assign, _ in bound.values():  # the literal leaves the process: the local binds None
      a0, b0 = sp.span(assign.value)
      sp.replace(a0, b0, b"None" + b"\n" * (assign.value.end_lineno - assign.value.lineno))
    if not required and func not in elsewhere:  # another file's ids would lose their rows
      required = hidden_tables.hide(p, fn, tree, sp, file, new, S, rng, owned)
    if required:
      p.required[fkey] = tuple(required)
      continue
    # Run by other files' ids and nothing else names it: renamed with those ids, its decoys
    # run in every class that runs it (their ids: `heads`). Where other classes define the
    # name too, renamed with exactly the ids their class hierarchy says run it, if nothing
    # else names it and nothing there is dynamic (hierarchy.rename_blocker); else kept.
    heads = ["::".join([file, *chain, ""])]
    runners = owned + [t for t, hit in (away or {}).items() if hit == (file, tuple(where), func)]
    why = ""
    if kept and not (func in movable and not uses and runners) and scope:
      runners, why = hierarchy.rename_blocker(*scope[:3], (file, tuple(where), func), scope[3])
    if kept and not why and runners:
      new = _fresh(func, rng, used)
      if _rename(p, sp, src, fn, new):
        done[(tuple(where), func)] = new
        heads, kept = sorted({record.split_id(t)[0] for t in runners}), ""
    if kept:
      why = f"; not renamed: {why}" if why else ""
      p.unprotected[key(file, chain, func)] = f"{kept}; no expected value to hide{why}"
      del done[(tuple(where), func)]
      continue
    tables = []
    for i in range(k + 1):
      if i == k and not tables:
        break  # a second decoy only for a shared table: its copies go before and after it
      try:
        decoy = decoys.decoy(fn, tree, _fresh(func, rng, used), R, P, rng, tables)
      except ValueError as e:  # a perturbed literal that has no source text
        p.unprotected[key(file, chain, func)] = f"no decoy: {e}"
        break
      p.decoys[decoy.name] = new
      p.decoyed[fkey] = p.decoyed.get(fkey, 0) + 1
      p.decoy_ids += [head + decoy.name for head in heads]
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
  # (Not in a file that only defines tests other files run: it is not collected.)
  if sentinel:
    chain, func = sorted(funcs)[int(rng.random() * len(funcs))]
    twin = done.get((chain, func), func)
    name = _fresh(func, rng, used)
    a = rng.randrange(1 << 40)
    tail_funcs.append(((), f"def {name}():\n    assert {a} == {a + rng.randrange(1, 1 << 20)}"))
    p.decoys[name] = twin
    p.decoy_ids.append(f"{file}::{name}")
  for tid in ids:  # every id whose function was rewritten (inherited methods too)
    _, chain, func = parts(tid)
    found = shape.find(tree, list(chain), func)
    if found and (tuple(found[0]), func) in done:
      p.owner[tid] = key(file, found[0], func)
      if tid not in p.ids:
        head, _, params = record.split_id(tid)
        p.ids[tid] = head + done[(tuple(found[0]), func)] + params
  for tid, (_, where, func) in (away or {}).items():  # other files' ids of a renamed one
    new = done.get((where, func), func)
    if new != func:
      head, _, params = record.split_id(tid)
      p.owner[tid], p.ids[tid] = key(file, where, func), head + new + params
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
    keep = splices.ident(rng)
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


def _rename(p: record.Plan, sp: splices.Splices, src: bytes, fn, new: str) -> bool:
  """Renames test function `fn` to `new` on its def line (recorded in `p.names`); False if
  that line does not hold its name."""
  a = sp.offset(fn.lineno, fn.col_offset)
  line_end = sp.starts[fn.lineno] if fn.lineno < len(sp.starts) else len(src)
  m = re.compile(rb"(async\s+)?def\s+" + re.escape(fn.name.encode()) + rb"\b").search(
    src, a, line_end
  )
  if m is None:
    return False
  p.names[new] = fn.name
  sp.replace(m.end() - len(fn.name.encode()), m.end(), new.encode())
  return True


def _fresh(func: str, rng, used: set) -> str:
  while True:
    token = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(6))
    name = renamed(func, token)
    if name not in used:
      used.add(name)
      return name


def renamed(name: str, token: str) -> str:
  """`name` with `token` inside, keeping its first and last word (pytest name patterns)."""
  if name.startswith("test"):
    rest = name[4:]
    return f"test_{token}" + ("" if not rest else rest if rest.startswith("_") else "_" + rest)
  head, sep, tail = name.partition("_")
  return f"{head}_{token}_{tail}" if sep else f"{name}_{token}"
