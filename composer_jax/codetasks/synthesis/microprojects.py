"""Micro-projects: seeded, procedurally generated Python packages for laptop-scale coding tasks.

A micro-project is a small but real package: `pyproject.toml` with PEP 621 metadata and its
pytest settings, a README, a package of 2-4 modules holding 6-12 small pure functions, and a
pytest suite of 1-2 tests per function. The task factory treats it as any other source (a
manifest entry `{"kind": "micro", "seed": S}`, `sources.resolve_entry`): the same deletion
and bug injection, the same validation, the same sandboxed grader.

Why such tasks are learnable by a small model: every function is 1-5 lines whose one-line
docstring states its behaviour exactly (constants included), so a deletion task's stub says
what to write, a bug task's failing test names the function, and the gold edit is a few
hundred bytes. Why they are not memorisable by name: each project draws its package and module
names, each function's family (36 families: arithmetic, sequences, strings, mappings;
arity 1-3; two of them, `HELDOUT_ONLY`, only in held-out projects), its name (verb x noun per family), parameter names, constants (scales, offsets,
thresholds, labels, separators), module placement, module re-exports and test style (names or
module imports, plain asserts or parametrized tables) from its seed. Test expectations are
computed by running the generated functions themselves (code this module wrote, never input).

  plan(seed) -> Plan (names, functions, styles)     project_files(seed) -> {path: text}
  write(seed, root) -> root                         entry(seed) -> a manifest entry
"""

from __future__ import annotations

import dataclasses
import random
import string

from composer_jax.codetasks.synthesis import split

VERSION = "3"  # bump when the generated trees change (the entry records it)

# Templates only held-out projects use, so held-out pass@1 measures writing code from a
# docstring, not recalling a trained template: a project whose name `split.is_heldout` at
# HELDOUT_FRACTION (split seed 0) holds all of them. `is_heldout` is monotone in the fraction,
# so these projects stay held out at any fraction >= HELDOUT_FRACTION (what
# `experiments.coding.learn` requires).
HELDOUT_ONLY = frozenset({"scale_above", "join_upper"})
HELDOUT_FRACTION = 0.25

_INT = ("n", "x", "value", "count", "amount", "num", "size", "k")
_INT2 = (("a", "b"), ("x", "y"), ("left", "right"), ("first", "second"), ("m", "n"))
_LIST = ("xs", "values", "items", "numbers", "data", "seq", "nums", "readings")
_STR = ("s", "text", "word", "name", "label", "line", "phrase")
_DICT = (("mapping",), ("table",), ("counts",), ("lookup",))
_DICT2 = (("a", "b"), ("left", "right"), ("base", "extra"))
_LABELS = (
  ("neg", "zero", "pos"),
  ("below", "at", "above"),
  ("low", "none", "high"),
  ("minus", "nil", "plus"),
  ("cold", "still", "warm"),
)
_SEPS = (", ", "-", "|", " ", "/", "::", "+")
_CHARS = "aeiostrn"
_PADS = ("*", ".", "0", "-", "#")


@dataclasses.dataclass(frozen=True)
class Family:
  """A kind of function: `$name`-style templates (string.Template) for its docstring and body.

  params: what each parameter is ('int', 'int2' = two ints, 'list', 'str', 'dict', 'dict2');
  verbs x nouns: its candidate names; consts(rng) -> template constants; args(rng, c) -> one
  call's arguments.
  """

  key: str
  params: tuple[str, ...]
  verbs: tuple[str, ...]
  nouns: tuple[str, ...]
  doc: str
  body: tuple[str, ...]
  consts: object
  args: object


def _nonzero(rng, lo, hi):
  return rng.choice([v for v in range(lo, hi + 1) if v])


def _ints(rng, lo=-20, hi=40, n=1):
  return tuple(rng.randint(lo, hi) for _ in range(n))


def _ilist(rng, lo=-9, hi=20, min_len=0, max_len=6):
  return [rng.randint(lo, hi) for _ in range(rng.randint(min_len, max_len))]


def _word(rng, n=None):
  return "".join(rng.choice("abcdeilmnorstu") for _ in range(n or rng.randint(2, 6)))


def _text(rng):
  return " ".join(_word(rng) for _ in range(rng.randint(1, 4)))


def _sdict(rng):
  keys = rng.sample(["a", "b", "c", "d", "e", "f"], rng.randint(0, 4))
  return {k: rng.randint(0, 9) for k in keys}


# fmt: off
FAMILIES = (
  Family("affine", ("int",), ("scale", "adjust", "rescale", "convert", "map"),
         ("value", "reading", "score", "level", "price"),
         "Return $a times $K plus $M.", ("return $a * $K + $M",),
         lambda r: dict(K=r.randint(2, 9), M=_nonzero(r, -9, 9)), lambda r, c: _ints(r)),
  Family("clamp", ("int", "int", "int"), ("clamp", "bound", "limit", "restrict"),
         ("value", "level", "number", "reading"),
         "Return $a limited to the closed range [$b, $c].", ("return max($b, min($c, $a))",),
         lambda r: {}, lambda r, c: (r.randint(-30, 30), *sorted(_ints(r, -15, 15, 2)))),
  Family("poly", ("int",), ("evaluate", "compute", "curve", "shape"),
         ("quadratic", "polynomial", "profile", "response"),
         "Return $K * $a ** 2 + $M * $a + $N.", ("return $K * $a ** 2 + $M * $a + $N",),
         lambda r: dict(K=r.randint(1, 5), M=r.randint(1, 6), N=_nonzero(r, -9, 9)),
         lambda r, c: _ints(r, -8, 8)),
  Family("scaled_sum", ("list",), ("sum", "total", "accumulate", "combine"),
         ("scaled", "weighted", "boosted", "stretched"),
         "Return the sum of the items of $a, each multiplied by $K.",
         ("return sum(v * $K for v in $a)",),
         lambda r: dict(K=r.randint(2, 7)), lambda r, c: (_ilist(r),)),
  Family("count_above", ("list",), ("count", "tally", "number_of"),
         ("above", "over", "large", "big"),
         "Return how many items of $a are greater than $K.",
         ("return sum(1 for v in $a if v > $K)",),
         lambda r: dict(K=r.randint(-3, 10)), lambda r, c: (_ilist(r),)),
  Family("keep_parity", ("list",), ("keep", "select", "filter", "pick"),
         ("even", "odd"), "Return the items of $a whose remainder modulo 2 is $R, in order.",
         ("return [v for v in $a if v % 2 == $R]",),
         lambda r: dict(R=r.randint(0, 1)), lambda r, c: (_ilist(r),)),
  Family("diffs", ("list",), ("pairwise", "consecutive", "step", "successive"),
         ("diffs", "gaps", "deltas", "changes"),
         "Return each item of $a minus the item before it (one fewer item).",
         ("return [q - p for p, q in zip($a, $a[1:])]",),
         lambda r: {}, lambda r, c: (_ilist(r),)),
  Family("running", ("list",), ("running", "cumulative", "prefix", "rolling"),
         ("totals", "sums", "tally", "balance"),
         "Return the running totals of $a, starting the total at $K.",
         ("total = $K", "out = []", "for v in $a:", "    total += v", "    out.append(total)",
          "return out"),
         lambda r: dict(K=r.randint(-5, 10)), lambda r, c: (_ilist(r),)),
  Family("spread", ("list",), ("spread", "range", "span", "extent"),
         ("of", "width", "size"),
         "Return the largest item of $a minus the smallest, or $K if $a is empty.",
         ("if not $a:", "    return $K", "return max($a) - min($a)"),
         lambda r: dict(K=r.randint(-3, 3)), lambda r, c: (_ilist(r),)),
  Family("chunk", ("list",), ("chunk", "split", "batch", "group"),
         ("items", "values", "runs", "blocks"),
         "Split $a into consecutive lists of $K items (the last may be shorter).",
         ("return [$a[i:i + $K] for i in range(0, len($a), $K)]",),
         lambda r: dict(K=r.randint(2, 4)), lambda r, c: (_ilist(r),)),
  Family("repeat_join", ("str", "int"), ("repeat", "echo", "copy", "stamp"),
         ("text", "word", "token", "label"),
         "Return $b copies of $a joined by $SEP.", ("return $SEP.join([$a] * $b)",),
         lambda r: dict(SEP=repr(r.choice(_SEPS))), lambda r, c: (_word(r), r.randint(0, 4))),
  Family("reverse_words", ("str",), ("reverse", "flip", "invert", "mirror"),
         ("words", "order", "phrase", "sentence"),
         "Return the words of $a in reverse order, joined by single spaces.",
         ('return " ".join(reversed($a.split()))',),
         lambda r: {}, lambda r, c: (_text(r),)),
  Family("head_upper", ("str",), ("shout", "head", "prefix", "lead"),
         ("upper", "caps", "start", "initial"),
         "Return the first $K characters of $a, upper-cased.", ("return $a[:$K].upper()",),
         lambda r: dict(K=r.randint(1, 5)), lambda r, c: (_text(r),)),
  Family("count_char", ("str",), ("count", "tally", "occurrences_of", "number_of"),
         ("letter", "char", "mark", "symbol"),
         "Return how many times $C occurs in $a.", ("return $a.count($C)",),
         lambda r: dict(C=repr(r.choice(_CHARS))), lambda r, c: (_text(r),)),
  Family("palindrome", ("str",), ("is", "check", "looks"),
         ("palindrome", "symmetric", "mirrored"),
         "Return whether $a reads the same backwards, ignoring case.",
         ("t = $a.lower()", "return t == t[::-1]"),
         lambda r: {}, lambda r, c: (r.choice([_word(r), "Level", "abba", "Noon", "xyx"]),)),
  Family("digit_sum", ("int",), ("digit", "sum", "cross"), ("sum", "total", "digits"),
         "Return the sum of the decimal digits of $a (its sign ignored).",
         ("return sum(int(ch) for ch in str(abs($a)))",),
         lambda r: {}, lambda r, c: _ints(r, -999, 9999)),
  Family("safe_div", ("int2",), ("safe", "checked", "guarded"), ("divide", "quotient", "ratio"),
         "Return $a // $b, or $K when $b is zero.",
         ("if $b == 0:", "    return $K", "return $a // $b"),
         lambda r: dict(K=r.randint(-1, 9)),
         lambda r, c: (r.randint(-50, 50), r.choice([0, *range(1, 8), *range(-5, 0)]))),
  Family("weighted", ("int2",), ("weigh", "blend", "mix", "combine"),
         ("pair", "scores", "inputs", "terms"),
         "Return $K times $a plus $M times $b.", ("return $K * $a + $M * $b",),
         lambda r: dict(K=r.randint(2, 6), M=_nonzero(r, -5, 5)), lambda r, c: _ints(r, n=2)),
  Family("sign_label", ("int",), ("label", "classify", "describe", "name"),
         ("sign", "direction", "polarity"),
         "Return $NEG for a negative $a, $ZERO for zero and $POS otherwise.",
         ("if $a < 0:", "    return $NEG", "if $a == 0:", "    return $ZERO", "return $POS"),
         lambda r: dict(zip(("NEG", "ZERO", "POS"), map(repr, r.choice(_LABELS)))),
         lambda r, c: (r.choice([0, *range(-9, 10)]),)),
  Family("triangular", ("int",), ("triangular", "sum_up_to", "stair"),
         ("number", "total", "count"),
         "Return the sum of the integers from 1 to $a.", ("return $a * ($a + 1) // 2",),
         lambda r: {}, lambda r, c: _ints(r, 0, 60)),
  Family("invert", ("dict",), ("invert", "swap", "flip", "reverse"),
         ("mapping", "table", "lookup", "index"),
         "Return a dict mapping each value of $a to its key.",
         ("return {v: k for k, v in $a.items()}",),
         lambda r: {}, lambda r, c: ({k: i for i, k in enumerate(r.sample("abcdef", 3))},)),
  Family("gcd", ("int2",), ("greatest", "common", "shared"), ("divisor", "factor", "measure"),
         "Return the greatest common divisor of $a and $b (never negative).",
         ("while $b:", "    $a, $b = $b, $a % $b", "return abs($a)"),
         lambda r: {}, lambda r, c: _ints(r, 0, 90, 2)),
  Family("char_counts", ("str",), ("count", "histogram", "tally", "census"),
         ("chars", "letters", "symbols"),
         "Return a dict mapping each character of $a to the number of times it occurs.",
         ("out = {}", "for ch in $a:", "    out[ch] = out.get(ch, 0) + 1", "return out"),
         lambda r: {}, lambda r, c: (_word(r),)),
  Family("pad_left", ("str",), ("pad", "align", "justify"), ("left", "right", "field"),
         "Return $a right-aligned in a field of $K characters, padded with $C.",
         ("return $a.rjust($K, $C)",),
         lambda r: dict(K=r.randint(4, 9), C=repr(r.choice(_PADS))), lambda r, c: (_word(r),)),
  Family("multiples", ("int",), ("first", "list", "make"), ("multiples", "steps", "ticks"),
         "Return the first $a multiples of $K, starting at $K.",
         ("return [$K * i for i in range(1, $a + 1)]",),
         lambda r: dict(K=r.randint(2, 9)), lambda r, c: _ints(r, 0, 6)),
  Family("argmax", ("list",), ("index_of", "position_of", "find"), ("max", "largest", "peak"),
         "Return the index of the first largest item of $a, or -1 if $a is empty.",
         ("if not $a:", "    return -1", "return $a.index(max($a))"),
         lambda r: {}, lambda r, c: (_ilist(r),)),
  Family("mean_floor", ("list",), ("mean", "average", "typical"), ("floor", "value", "level"),
         "Return the sum of $a floor-divided by its length, or $K if $a is empty.",
         ("if not $a:", "    return $K", "return sum($a) // len($a)"),
         lambda r: dict(K=r.randint(-2, 5)), lambda r, c: (_ilist(r),)),
  Family("merge_counts", ("dict2",), ("merge", "add", "combine", "sum"),
         ("counts", "tallies", "totals"),
         "Return a dict of the keys of $a and $b, with the values of shared keys added.",
         ("out = dict($a)", "for k, v in $b.items():", "    out[k] = out.get(k, 0) + v",
          "return out"),
         lambda r: {}, lambda r, c: (_sdict(r), _sdict(r))),
  Family("initials", ("str",), ("initials", "acronym", "abbreviate"), ("of", "for", "from"),
         "Return the first letter of each word of $a, upper-cased and joined.",
         ('return "".join(w[0].upper() for w in $a.split())',),
         lambda r: {}, lambda r, c: (_text(r),)),
  Family("rotate", ("list",), ("rotate", "cycle", "shift", "turn"), ("left", "items", "ring"),
         "Return $a rotated left by $K positions (an empty list stays empty).",
         ("if not $a:", "    return []", "k = $K % len($a)", "return $a[k:] + $a[:k]"),
         lambda r: dict(K=r.randint(1, 5)), lambda r, c: (_ilist(r),)),
  Family("shift_items", ("list",), ("shift", "offset", "raise", "lift"),
         ("items", "values", "all", "each"),
         "Return each item of $a plus $K, in order.", ("return [v + $K for v in $a]",),
         lambda r: dict(K=_nonzero(r, -9, 9)), lambda r, c: (_ilist(r),)),
  Family("max_or", ("list",), ("largest", "top", "maximum", "best"), ("item", "of", "value"),
         "Return the largest item of $a, or $K if $a is empty.",
         ("if not $a:", "    return $K", "return max($a)"),
         lambda r: dict(K=r.randint(-5, 5)), lambda r, c: (_ilist(r),)),
  Family("sum_below", ("list",), ("sum", "total", "add"), ("below", "under", "small", "low"),
         "Return the sum of the items of $a that are less than $K.",
         ("return sum(v for v in $a if v < $K)",),
         lambda r: dict(K=r.randint(-3, 12)), lambda r, c: (_ilist(r),)),
  Family("count_long", ("str",), ("count", "tally", "number_of"), ("long", "wide", "big"),
         "Return how many words of $a have more than $K characters.",
         ("return sum(1 for w in $a.split() if len(w) > $K)",),
         lambda r: dict(K=r.randint(1, 4)), lambda r, c: (_text(r),)),
  # Held-out only (`HELDOUT_ONLY`): compositions of what the families above state one by one.
  Family("scale_above", ("list",), ("boost", "amplify", "grow", "stretch"),
         ("above", "large", "high", "big"),
         "Return the items of $a greater than $K, each multiplied by $M, in order.",
         ("return [v * $M for v in $a if v > $K]",),
         lambda r: dict(K=r.randint(-3, 8), M=r.randint(2, 7)), lambda r, c: (_ilist(r),)),
  Family("join_upper", ("str",), ("shout", "loud", "caps"), ("words", "joined", "all"),
         "Return the words of $a upper-cased, joined by $SEP.",
         ("return $SEP.join(w.upper() for w in $a.split())",),
         lambda r: dict(SEP=repr(r.choice(_SEPS))), lambda r, c: (_text(r),)),
)
# fmt: on

_MODULES = (
  "core",
  "numbers",
  "text",
  "lists",
  "ops",
  "util",
  "stats",
  "strings",
  "mathx",
  "seqs",
  "tables",
  "convert",
  "calc",
  "helpers",
  "tools",
  "series",
)
_SYLLABLES = (
  "ba",
  "ko",
  "ri",
  "ta",
  "mu",
  "ne",
  "lo",
  "vi",
  "sa",
  "qu",
  "de",
  "fa",
  "zo",
  "pi",
  "gu",
  "xe",
  "ly",
  "wa",
  "ho",
  "ce",
)
_TOPICS = (
  "small numeric helpers",
  "text utilities",
  "list and counting helpers",
  "a grab bag of pure functions",
  "conversion helpers",
  "sequence tools",
)


@dataclasses.dataclass
class Function:
  name: str
  family: Family
  params: tuple[str, ...]
  consts: dict
  source: str


def _params(rng, family: Family) -> tuple[str, ...]:
  out: list[str] = []
  for kind in family.params:
    pool = {"int": _INT, "list": _LIST, "str": _STR}.get(kind)
    if pool is not None:
      out.append(rng.choice([p for p in pool if p not in out]))
    else:
      out.extend(rng.choice({"int2": _INT2, "dict": _DICT, "dict2": _DICT2}[kind]))
  return tuple(out)


def _function(rng, family: Family, name: str) -> Function:
  params = _params(rng, family)
  consts = family.consts(rng)
  subs = {**dict(zip("abc", params)), **{k: str(v) for k, v in consts.items()}}
  doc = string.Template(family.doc).substitute(subs)
  body = [string.Template(ln).substitute(subs) for ln in family.body]
  src = f'def {name}({", ".join(params)}):\n    """{doc}"""\n'
  src += "".join(f"    {ln}\n" for ln in body)
  return Function(name, family, params, consts, src)


def _name(rng, family: Family, taken: set[str]) -> str | None:
  for _ in range(20):
    name = f"{rng.choice(family.verbs)}_{rng.choice(family.nouns)}"
    if name not in taken:
      return name
  return None


def _cases(rng, fn: Function, k: int) -> list[tuple[tuple, object]]:
  """k distinct (args, expected) pairs, expected from running fn's own generated source;
  inputs with distinct results come first, so a changed result shows in some case."""
  ns: dict = {}
  exec(compile(fn.source, f"<micro {fn.name}>", "exec"), ns)  # our own template code
  pool: dict[str, tuple] = {}
  for _ in range(30):
    args = fn.family.args(rng, fn.consts)
    pool.setdefault(repr(args), (args, ns[fn.name](*_copy(args))))
  out, results = [], set()
  for args, want in pool.values():
    if repr(want) not in results and len(out) < k:
      out.append((args, want))
      results.add(repr(want))
  out += [c for c in pool.values() if c not in out][: k - len(out)]
  return out


def _copy(args):
  return tuple(
    dict(a) if isinstance(a, dict) else list(a) if isinstance(a, list) else a for a in args
  )


def _import(module: str, names: list[str]) -> str:
  line = f"from {module} import {', '.join(names)}"
  if len(line) <= 88:
    return line
  return f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")"


def _call(name: str, args: tuple) -> str:
  return f"{name}({', '.join(map(repr, args))})"


@dataclasses.dataclass
class Plan:
  """Everything drawn from the seed: names, functions per module, styles."""

  seed: int
  package: str
  dist: str
  version: str
  topic: str
  modules: dict[str, list[Function]]
  import_style: str  # 'names' (from pkg.mod import f) or 'module' (from pkg import mod)
  parametrize: bool
  reexport: bool


def plan(seed: int) -> Plan:
  rng = random.Random(f"composer_jax.micro:{VERSION}:{seed}")
  package = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
  mods = rng.sample(_MODULES, rng.randint(2, 4))
  n_funcs = rng.randint(6, 12)
  dist = f"{package}-{seed}"
  if split.is_heldout(dist, HELDOUT_FRACTION):  # every held-out-only template, then others
    reserved = [f for f in FAMILIES if f.key in HELDOUT_ONLY]
    seen = [f for f in FAMILIES if f.key not in HELDOUT_ONLY]
    families = reserved + rng.sample(seen, n_funcs - len(reserved))
    rng.shuffle(families)
  else:
    families = rng.sample([f for f in FAMILIES if f.key not in HELDOUT_ONLY], n_funcs)
  taken: set[str] = set(mods) | {package}
  modules: dict[str, list[Function]] = {m: [] for m in mods}
  for i, fam in enumerate(families):
    name = _name(rng, fam, taken)
    if name is None:
      continue
    taken.add(name)
    # Every module gets a function first, then the rest at random.
    mod = mods[i] if i < len(mods) else rng.choice(mods)
    modules[mod].append(_function(rng, fam, name))
  version = f"{rng.randint(0, 2)}.{rng.randint(0, 12)}.{rng.randint(0, 9)}"
  return Plan(
    seed,
    package,
    dist,
    version,
    rng.choice(_TOPICS),
    modules,
    rng.choice(("names", "module")),
    rng.random() < 0.4,
    rng.random() < 0.2,
  )


def _test_module(p: Plan, mod: str, fns: list[Function], rng) -> str:
  ref = (lambda f: f.name) if p.import_style == "names" else (lambda f: f"{mod}.{f.name}")
  head = ["import pytest", ""] if p.parametrize else []
  if p.import_style == "names":
    head.append(_import(f"{p.package}.{mod}", [f.name for f in fns]))
  else:
    head.append(f"from {p.package} import {mod}")
  blocks = []
  for fn in fns:
    tests = [("", _cases(rng, fn, 3))]
    if rng.random() < 0.5:  # a second test: different inputs, a separate FAIL_TO_PASS id
      tests.append((f"_{rng.choice(('more', 'again', 'cases', 'extra'))}", _cases(rng, fn, 2)))
    for suffix, cases in tests:
      name = f"test_{fn.name}{suffix}"
      if p.parametrize:
        rows = "".join(f"    ({args!r}, {want!r}),\n" for args, want in cases)
        blocks.append(
          f'@pytest.mark.parametrize("args, want", [\n{rows}])\n'
          f"def {name}(args, want):\n    assert {ref(fn)}(*args) == want\n"
        )
      else:
        lines = "".join(f"    assert {_call(ref(fn), a)} == {w!r}\n" for a, w in cases)
        blocks.append(f"def {name}():\n{lines}")
  return "\n".join(head) + "\n\n\n" + "\n\n".join(blocks)


def project_files(seed: int) -> dict[str, str]:
  """The micro-project of `seed`: relative path -> text (deterministic)."""
  p = plan(seed)
  rng = random.Random(f"composer_jax.micro.tests:{VERSION}:{seed}")
  files = {
    "pyproject.toml": (
      '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
      f'[project]\nname = "{p.dist}"\nversion = "{p.version}"\n'
      f'description = "{p.package}: {p.topic}"\nrequires-python = ">=3.9"\n'
      'license = {text = "MIT"}\n\n[tool.setuptools]\n'
      f'packages = ["{p.package}"]\n\n'
      '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'
    ),
    "README.md": f"# {p.dist}\n\n{p.topic.capitalize()}, pure functions with tests.\n\n"
    "    pip install -e . && pytest\n",
  }
  init = [f'"""{p.package}: {p.topic}."""', ""]
  if p.reexport:  # modules, not names: a deletion's gold patch stays one block of one file
    init.append(f"from . import {', '.join(sorted(p.modules))}")
  init += ["", f'__version__ = "{p.version}"']
  files[f"{p.package}/__init__.py"] = "\n".join(init) + "\n"
  for mod, fns in p.modules.items():
    doc = f'"""{mod.capitalize()} helpers of {p.package}."""\n\n\n'
    files[f"{p.package}/{mod}.py"] = doc + "\n\n".join(f.source for f in fns)
    files[f"tests/test_{mod}.py"] = _test_module(p, mod, fns, rng)
  return files


def write(seed: int, root):
  """Writes the micro-project of `seed` under `root` (a new or empty directory); returns it."""
  from pathlib import Path

  root = Path(root)
  for rel, text in project_files(seed).items():
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text, encoding="utf-8")
  return root


def entry(seed: int) -> dict:
  """The manifest entry of micro-project `seed` (`sources.resolve_entry` builds it)."""
  return {"kind": "micro", "seed": int(seed), "name": f"micro-{int(seed)}", "version": VERSION}
