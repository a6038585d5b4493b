"""What an expression means statically: the dotted names it may denote, the constants it may be.

`Resolver(tree, module)` binds every name of one module per scope (module, class, function,
lambda, comprehension), flow-insensitively: a name bound several times keeps every binding.
- `resolve(node)` -> the set of dotted names an expression may denote, through aliases
  (`import sys as s`, `g = s._getframe`, `from os import environ as e`), `__import__`,
  `importlib.import_module`, `getattr`, `sys.modules[...]`, `vars(m)[...]`, `m.__dict__[...]`
  and `__builtins__[...]`, with constant names folded. Unbound names that are builtins resolve to
  `builtins.NAME`.
- `fold(node)` -> the set of values a constant expression may take (None = unknown):
  literals, `+ * %`, f-strings of constants, `sep.join(...)`, `chr`, `bytes(...).decode()`,
  base64/codecs/hex decoders, slicing, comprehensions over constants, names bound to constants.
Identifiers and names built from strings are NFKC-normalised (what Python does to identifiers).
"""

import ast
import base64
import binascii
import builtins
import codecs
import collections
import itertools
import re
import unicodedata

MAX_CANDIDATES = 16  # more possible values than this = unknown
MAX_LEN = 1 << 14  # longer folded strings/bytes/tuples = unknown (no `"a" * 10**9`)
_DEPTH = 40
_BIG_INT = 1 << 21  # chr() tops out at 0x10FFFF
_BIG_WIDTH = re.compile(r"\d{6,}")
_BUILTINS = frozenset(dir(builtins))
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)
_COMPS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
# Pure functions of constants that obfuscation uses to build names; called on folded arguments.
_FOLD_FUNCS = {
  "builtins.chr": chr,
  "builtins.str": str,
  "builtins.bytes": bytes,
  "builtins.bytearray": lambda *a: bytes(bytearray(*a)),
  "builtins.tuple": tuple,
  "builtins.list": tuple,
  "builtins.reversed": lambda x: tuple(reversed(x)),
  "builtins.sorted": lambda x: tuple(sorted(x)),
  "builtins.int": int,
  "builtins.ord": ord,
  "builtins.bytes.fromhex": bytes.fromhex,
  "builtins.str.join": str.join,
  "codecs.decode": codecs.decode,
  "codecs.encode": codecs.encode,
  "binascii.unhexlify": binascii.unhexlify,
  "binascii.a2b_hex": binascii.a2b_hex,
  "binascii.a2b_base64": binascii.a2b_base64,
  **{
    f"base64.{n}": getattr(base64, n)
    for n in ("b64decode", "b32decode", "b16decode", "a85decode", "b85decode", "urlsafe_b64decode")
  },
}
_FOLD_METHODS = frozenset(
  "join replace lower upper strip lstrip rstrip decode encode format title capitalize swapcase "
  "casefold removeprefix removesuffix zfill split rsplit partition rpartition hex".split()
)


def nfkc(s: str) -> str:
  return unicodedata.normalize("NFKC", s)


def _small(v) -> bool:
  if isinstance(v, (str, bytes, tuple)):
    return len(v) <= MAX_LEN and (not isinstance(v, tuple) or all(_small(x) for x in v))
  return isinstance(v, (int, float, complex, bool, type(None), type(Ellipsis)))


def _bounded(combo) -> bool:
  """No argument that would make a str/bytes builder allocate a lot (`bytes(10**9)`,
  `"%999999999d" % 1`, `"x".zfill(10**9)`)."""
  return all(
    not (isinstance(v, int) and abs(v) > _BIG_INT)
    and not (isinstance(v, str) and _BIG_WIDTH.search(v))
    for v in combo
  )


def _combine(sets, fn, bounded=True):
  """{fn(*combo)} over the product of candidate sets; None if unknown, too many or failing."""
  if any(s is None for s in sets):
    return None
  n = 1
  for s in sets:
    n *= len(s)
  if n > MAX_CANDIDATES:
    return None
  out = set()
  for combo in itertools.product(*sets):
    if bounded and not _bounded(combo):
      return None
    try:
      v = fn(*combo)
    except Exception:  # a constant expression that raises folds to nothing we can read
      return None
    if isinstance(v, list):
      v = tuple(v)
    if not _small(v):
      return None
    out.add(v)
  return frozenset(out)


def _mul(a, b):
  if isinstance(a, (str, bytes, tuple)) and isinstance(b, int) and len(a) * b > MAX_LEN:
    raise OverflowError
  if isinstance(b, (str, bytes, tuple)) and isinstance(a, int) and len(b) * a > MAX_LEN:
    raise OverflowError
  return a * b


_BINOPS = {  # op -> (function, whether its arguments must be bounded)
  ast.Add: (lambda a, b: a + b, False),
  ast.Mult: (_mul, False),
  ast.Mod: (lambda a, b: a % b, True),
  ast.Sub: (lambda a, b: a - b, False),
  ast.BitXor: (lambda a, b: a ^ b, False),
}


class Scope:
  def __init__(self, node, parent):
    self.node, self.parent = node, parent
    self.bindings = collections.defaultdict(list)  # name -> [(kind, payload)]
    self.declared_global: set[str] = set()

  @property
  def is_class(self) -> bool:
    return isinstance(self.node, ast.ClassDef)


class Resolver:
  """Scopes and bindings of one parsed module (see the module docstring)."""

  def __init__(self, tree: ast.AST, module: str = "", is_package: bool = False):
    self.module = module
    self.package = module if is_package else module.rpartition(".")[0]
    self.scope_of: dict[int, Scope] = {}  # id(node) -> scope the node's names are looked up in
    self.root = Scope(tree, None)
    self._folded: dict[int, frozenset | None] = {}
    self._resolved: dict[int, frozenset] = {}
    # Per binding list (one name in one scope): every use of a name shares one result, so a
    # name bound n times and used n times costs O(n), not O(n^2).
    self._name_resolved: dict[int, frozenset] = {}
    self._name_folded: dict[int, frozenset | None] = {}
    self.star_imports: list[str] = []
    self._bind_block(tree, self.root)

  # ---- binding --------------------------------------------------------------------------
  def _bind(self, scope, name, kind, payload=None):
    name = nfkc(name)
    target = self.root if name in scope.declared_global else scope
    target.bindings[name].append((kind, payload))

  def _bind_target(self, target, value, scope):
    if isinstance(target, ast.Name):
      self._bind(scope, target.id, "expr" if value is not None else "unknown", value)
    elif isinstance(target, (ast.Tuple, ast.List)):
      values = value.elts if isinstance(value, (ast.Tuple, ast.List)) else None
      if values is not None and len(values) == len(target.elts):
        for t, v in zip(target.elts, values, strict=True):
          self._bind_target(t, v, scope)
      else:
        for t in target.elts:
          self._bind_target(t, None, scope)
    elif isinstance(target, ast.Starred):
      self._bind_target(target.value, None, scope)

  def _import_name(self, node: ast.ImportFrom) -> str:
    if not node.level:
      return node.module or ""
    base = self.package.split(".") if self.package else []
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join([*base, *([node.module] if node.module else [])])

  def _bind_block(self, node, scope):
    """Walks node's subtree, recording bindings and the scope of every node."""
    for child in ast.iter_child_nodes(node):
      self._visit(child, scope)

  def _visit(self, node, scope):
    self.scope_of[id(node)] = scope
    if isinstance(node, ast.Global):
      scope.declared_global.update(nfkc(n) for n in node.names)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      self._bind(scope, node.name, "def", node)
      for d in node.decorator_list:
        self._visit(d, scope)
      inner = Scope(node, scope)
      if isinstance(node, ast.ClassDef):
        for b in [*node.bases, *node.keywords]:
          self._visit(b, scope)
        for stmt in node.body:
          self._visit(stmt, inner)
      else:
        self._visit_args(node.args, scope, inner)
        if node.returns:
          self._visit(node.returns, scope)
        for stmt in node.body:
          self._visit(stmt, inner)
      return
    if isinstance(node, ast.Lambda):
      inner = Scope(node, scope)
      self._visit_args(node.args, scope, inner)
      self._visit(node.body, inner)
      return
    if isinstance(node, _COMPS):
      inner = Scope(node, scope)
      for i, gen in enumerate(node.generators):
        self._visit(gen.iter, scope if i == 0 else inner)
        self._bind_target(gen.target, None, inner)
        self._visit(gen.target, inner)
        for cond in gen.ifs:
          self._visit(cond, inner)
      for part in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
        self._visit(part, inner)
      return
    if isinstance(node, ast.Import):
      for a in node.names:
        full = nfkc(a.name)
        if a.asname:
          self._bind(scope, a.asname, "import", full)
        else:
          self._bind(scope, full.split(".")[0], "import", full.split(".")[0])
    elif isinstance(node, ast.ImportFrom):
      base = nfkc(self._import_name(node))
      for a in node.names:
        if a.name != "*":
          self._bind(scope, a.asname or a.name, "import", f"{base}.{nfkc(a.name)}".lstrip("."))
        else:
          self.star_imports.append(base)  # `from os import *`: any free name may be os.NAME
    elif isinstance(node, ast.Assign):
      for t in node.targets:
        self._bind_target(t, node.value, scope)
    elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
      self._bind_target(node.target, node.value, scope)
    elif isinstance(node, ast.AugAssign):
      self._bind_target(node.target, None, scope)
    elif isinstance(node, (ast.For, ast.AsyncFor)):
      self._bind_target(node.target, None, scope)
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
      self._bind_target(node.optional_vars, None, scope)
    elif isinstance(node, ast.ExceptHandler) and node.name:
      self._bind(scope, node.name, "unknown")
    elif isinstance(node, ast.Delete):
      for t in node.targets:
        self._bind_target(t, None, scope)
    self._bind_block(node, scope)

  def _visit_args(self, args: ast.arguments, outer, inner):
    for d in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
      self._visit(d, outer)
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
      if a is not None:
        self._bind(inner, a.arg, "unknown")
        self.scope_of[id(a)] = inner
        if a.annotation:
          self._visit(a.annotation, outer)

  # ---- lookup ---------------------------------------------------------------------------
  def bindings(self, name: str, scope: Scope) -> list | None:
    """Bindings visible for `name` from scope (None: unbound, i.e. a builtin or undefined)."""
    s, first = scope, True
    while s is not None:
      if name in s.bindings and (first or not s.is_class):
        return s.bindings[name]
      s, first = s.parent, False
    return None

  def resolve(self, node, env=None, depth=0) -> frozenset:
    if depth > _DEPTH:
      return frozenset()
    if env is None:
      key = id(node)
      if key not in self._resolved:
        self._resolved[key] = frozenset()  # a cycle (`a = b; b = a`) denotes nothing
        self._resolved[key] = self._resolve(node, None, depth)
      return self._resolved[key]
    return self._resolve(node, env, depth)

  def _resolve(self, node, env, depth) -> frozenset:
    d = depth + 1
    if isinstance(node, ast.Name):
      name = nfkc(node.id)
      if env and name in env:
        return frozenset()
      recs = self.bindings(name, self.scope_of.get(id(node), self.root))
      if recs is None:
        if name == "__builtins__":
          return frozenset({"builtins"})
        if name in _BUILTINS:
          return frozenset({"builtins." + name})
        return frozenset(f"{m}.{name}" for m in self.star_imports)
      if env is None and id(recs) in self._name_resolved:
        return self._name_resolved[id(recs)]
      if env is None:
        self._name_resolved[id(recs)] = frozenset()  # a cycle denotes nothing
      out = set()
      for kind, payload in recs:
        if kind == "import":
          out.add(payload)
        elif kind == "expr":
          out |= self.resolve(payload, None, d)
      if env is None:
        self._name_resolved[id(recs)] = frozenset(out)
      return frozenset(out)
    if isinstance(node, ast.Attribute):
      return frozenset(f"{b}.{nfkc(node.attr)}" for b in self.resolve(node.value, env, d))
    if isinstance(node, ast.NamedExpr):
      return self.resolve(node.value, env, d)
    if isinstance(node, ast.Call):
      return self._resolve_call(node, env, d)
    if isinstance(node, ast.Subscript):
      keys = self.fold(node.slice, env, d) or frozenset()
      keys = {nfkc(k) for k in keys if isinstance(k, str)}
      if self.is_namespace(node.value, env, d):
        out = set()
        for b in self.namespace_owner(node.value, env, d):
          if b == (self.module or "__main__"):  # globals()["sys"]: this module's own binding
            for k in keys:
              for kind, payload in self.root.bindings.get(k, ()):
                if kind == "import":
                  out.add(payload)
                elif kind == "expr":
                  out |= self.resolve(payload, None, d)
          out |= {f"{b}.{k}" for k in keys}
        return frozenset(out)
      if "sys.modules" in self.resolve(node.value, env, d):
        return frozenset(keys)
    return frozenset()

  def is_namespace(self, node, env=None, depth=0) -> bool:
    """`vars(x)`, `x.__dict__`, `globals()`, `__builtins__` (a dict of names)."""
    if isinstance(node, ast.Attribute) and nfkc(node.attr) == "__dict__":
      return True
    if isinstance(node, ast.Call):
      fn = self.resolve(node.func, env, depth)
      return bool(fn & {"builtins.vars", "builtins.globals", "builtins.locals"})
    return "builtins" in self.resolve(node, env, depth) and isinstance(node, ast.Name)

  def namespace_owner(self, node, env=None, depth=0) -> frozenset:
    if isinstance(node, ast.Attribute):
      return self.resolve(node.value, env, depth)
    if isinstance(node, ast.Call):
      fn = self.resolve(node.func, env, depth)
      if "builtins.vars" in fn and node.args:
        return self.resolve(node.args[0], env, depth)
      return frozenset({self.module or "__main__"})
    return frozenset({"builtins"})

  def _resolve_call(self, node: ast.Call, env, d) -> frozenset:
    if isinstance(node.func, ast.Lambda):  # (lambda: __import__("sys"))()
      return self.resolve(node.func.body, env, d)
    fn = self.resolve(node.func, env, d)
    args = node.args
    if not args:
      return frozenset()
    if fn & {"builtins.__import__", "importlib.__import__"}:
      names = {nfkc(n) for n in self.fold(args[0], env, d) or () if isinstance(n, str)}
      has_from = len(args) > 3 or any(k.arg == "fromlist" for k in node.keywords)
      return frozenset(n if has_from else n.split(".")[0] for n in names)
    if "importlib.import_module" in fn:
      pkg = self.fold(args[1], env, d) if len(args) > 1 else {self.package}
      out = set()
      for n in self.fold(args[0], env, d) or ():
        if isinstance(n, str):
          n = nfkc(n)
          if n.startswith("."):
            for p in pkg or ():
              level = len(n) - len(n.lstrip("."))
              base = str(p).split(".")
              base = base[: len(base) - level + 1]
              out.add(".".join([*base, n.lstrip(".")]).strip("."))
          else:
            out.add(n)
      return frozenset(out)
    if "builtins.getattr" in fn and len(args) >= 2:
      names = {nfkc(n) for n in self.fold(args[1], env, d) or () if isinstance(n, str)}
      return frozenset(f"{b}.{n}" for b in self.resolve(args[0], env, d) for n in names)
    return frozenset()

  # ---- constant folding -----------------------------------------------------------------
  def fold(self, node, env=None, depth=0) -> frozenset | None:
    if depth > _DEPTH or node is None:
      return None
    if env is None:
      key = id(node)
      if key not in self._folded:
        self._folded[key] = None  # a cycle (`x = x + "a"`) folds to unknown
        self._folded[key] = self._fold(node, None, depth)
      return self._folded[key]
    return self._fold(node, env, depth)

  def _fold(self, node, env, depth) -> frozenset | None:
    d = depth + 1
    if isinstance(node, ast.Constant):
      return frozenset({node.value}) if _small(node.value) else None
    if isinstance(node, ast.Name):
      return self._fold_name(node, env, d)
    if isinstance(node, ast.JoinedStr):
      parts = [self._fold_fstring_part(v, env, d) for v in node.values]
      return _combine(parts, lambda *s: "".join(s))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
      fn, bounded = _BINOPS[type(node.op)]
      return _combine([self.fold(node.left, env, d), self.fold(node.right, env, d)], fn, bounded)
    if isinstance(node, (ast.Tuple, ast.List)):
      return _combine([self.fold(e, env, d) for e in node.elts], lambda *x: tuple(x))
    if isinstance(node, ast.IfExp):
      a, b = self.fold(node.body, env, d), self.fold(node.orelse, env, d)
      return None if a is None or b is None else a | b
    if isinstance(node, ast.Subscript):
      index = (lambda v, i: v[slice(*i)]) if isinstance(node.slice, ast.Slice) else None
      return _combine(
        [self.fold(node.value, env, d), self._fold_slice(node.slice, env, d)],
        index or (lambda v, i: v[i]),
      )
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
      return self._fold_comp(node, env, d)
    if isinstance(node, ast.Call):
      return self._fold_call(node, env, d)
    if isinstance(node, ast.NamedExpr):
      return self.fold(node.value, env, d)
    return None

  def _fold_name(self, node, env, d):
    name = nfkc(node.id)
    if env and name in env:
      return frozenset({env[name]})
    recs = self.bindings(name, self.scope_of.get(id(node), self.root))
    if recs is None and name in ("__name__", "__package__") and self.module:
      return frozenset({self.module if name == "__name__" else self.package})
    if not recs or any(kind != "expr" for kind, _ in recs):
      return None
    if id(recs) in self._name_folded:
      return self._name_folded[id(recs)]
    self._name_folded[id(recs)] = None  # a cycle folds to unknown
    out = set()
    for _, payload in recs:
      v = self.fold(payload, None, d)
      if v is None:
        return None
      out |= v
    result = frozenset(out) if len(out) <= MAX_CANDIDATES else None
    self._name_folded[id(recs)] = result
    return result

  def _fold_fstring_part(self, v, env, d):
    if isinstance(v, ast.Constant):
      return frozenset({v.value})
    spec = self.fold(v.format_spec, env, d) if v.format_spec else frozenset({""})
    conv = {-1: lambda x: x, 115: str, 114: repr, 97: ascii}.get(v.conversion, str)
    return _combine([self.fold(v.value, env, d), spec], lambda x, s: format(conv(x), s))

  def _fold_slice(self, node, env, d):
    if isinstance(node, ast.Slice):
      parts = [
        self.fold(p, env, d) if p is not None else frozenset({None})
        for p in (node.lower, node.upper, node.step)
      ]
      return _combine(parts, lambda a, b, c: (a, b, c))  # slices are unhashable before 3.12
    return self.fold(node, env, d)

  def _fold_comp(self, node, env, d):
    if len(node.generators) != 1 or not isinstance(node.generators[0].target, ast.Name):
      return None
    gen = node.generators[0]
    seqs = self.fold(gen.iter, env, d)
    if seqs is None or len(seqs) != 1:
      return None
    (seq,) = seqs
    if not isinstance(seq, (tuple, str, bytes)) or len(seq) > 256:
      return None
    name, out = nfkc(gen.target.id), []
    for item in seq:
      inner = {**(env or {}), name: item}
      keep = [self.fold(c, inner, d) for c in gen.ifs]
      if any(k is None or len(k) != 1 for k in keep):
        return None
      if all(next(iter(k)) for k in keep):
        v = self.fold(node.elt, inner, d)
        if v is None or len(v) != 1:
          return None
        out.append(next(iter(v)))
    return frozenset({tuple(out)})

  def _fold_call(self, node, env, d):
    if node.keywords and any(k.arg is None for k in node.keywords):
      return None
    args = [self.fold(a, env, d) for a in node.args]
    kw_names = [k.arg for k in node.keywords]
    kws = [self.fold(k.value, env, d) for k in node.keywords]
    call = lambda f: lambda *v: f(*v[: len(args)], **dict(zip(kw_names, v[len(args) :])))
    func = node.func
    if isinstance(func, ast.Attribute) and nfkc(func.attr) in _FOLD_METHODS:
      recv = self.fold(func.value, env, d)
      if recv is not None:
        return _combine([recv, *args, *kws], lambda r, *v: call(getattr(r, nfkc(func.attr)))(*v))
    for name in self.resolve(func, env, d):
      if name in _FOLD_FUNCS:
        return _combine([*args, *kws], call(_FOLD_FUNCS[name]))
    if "builtins.map" in self.resolve(func, env, d) and len(node.args) == 2:
      fns = [f for f in self.resolve(node.args[0], env, d) if f in _FOLD_FUNCS]
      if fns:
        return _combine([args[1]], lambda seq: tuple(map(_FOLD_FUNCS[fns[0]], seq)))
    return None

  def fold_strings(self, node, env=None) -> set[str]:
    """The NFKC-normalised strings (or decoded bytes) an expression may be; empty if unknown."""
    out = set()
    for v in self.fold(node, env) or ():
      if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
      if isinstance(v, str):
        out.add(nfkc(v))
    return out
