"""The grade-time rewriting of hidden tests (instrument.py) and the site values' plain-data
encoding (site_values.py), without a sandbox: renames, hidden sites and tables, decoys, the
mapping of ids, perturbations, canonical readings and the lying-value probe."""

import ast
import collections
import decimal
import fractions
import random
import textwrap

import pytest

from composer_jax.codetasks.sandbox import instrument, site_values

SRC = textwrap.dedent(
  """\
  import pytest
  from pkg import mod

  TABLE = [(1, "a"), (2, "bb")]
  SHARED = [(3, 9.0), (4, 16.0)]


  @pytest.mark.parametrize("n,want", TABLE)
  def test_table(n, want):
    assert mod.f(n) == want


  @pytest.mark.parametrize("n,want", SHARED)
  def test_shared(n, want):
    assert mod.sq(n) == want


  def test_shared_len():
    assert len(SHARED) == 2


  def test_literal():
    got = mod.f(
      1,
    )
    assert got == {"k": [1, 2.5]}
    assert mod.g() == pytest.approx(0.3, rel=1e-3)


  class TestCase:
    def test_method(self):
      self.assertEqual(mod.f(2), "bb")

    def test_raises(self):
      with pytest.raises(ValueError):
        mod.f(-1)


  def test_called_elsewhere():
    assert mod.f(1) == "a"


  def test_user():
    test_called_elsewhere()


  def test_loop():
    for n in (1, 2):
      assert mod.f(n) == "loop"
  """
)
F2P = [
  "tests/test_m.py::test_table[1-a]",
  "tests/test_m.py::test_table[2-bb]",
  "tests/test_m.py::test_shared[3-9.0]",
  "tests/test_m.py::test_shared[4-16.0]",
  "tests/test_m.py::test_literal",
  "tests/test_m.py::TestCase::test_method",
  "tests/test_m.py::TestCase::test_raises",
  "tests/test_m.py::test_called_elsewhere",
  "tests/test_m.py::test_loop",
]
IDS = F2P + ["tests/test_m.py::test_shared_len", "tests/test_m.py::test_user"]


@pytest.fixture(scope="module")
def plan():
  return instrument.plan({"tests/test_m.py": SRC.encode()}, F2P, IDS, rng=random.Random(3))


def test_names_keep_their_patterns():
  for name, pattern in [("test_hypot", "test"), ("testHypot", "test"), ("check_x", "check_")]:
    new = instrument.renamed(name, "k3q9zz")
    assert new.startswith(pattern) and "k3q9zz" in new and new != name
  assert instrument.renamed("hypot_test", "k3q9zz").endswith("_test")


def test_rewritten_file(plan):
  new = plan.files["tests/test_m.py"].decode()
  ast.parse(new)
  old_lines, new_lines = SRC.splitlines(), new.splitlines()
  # Line numbers of the original code do not move; what follows is the appended tail.
  assert len(new_lines) > len(old_lines)
  assert new_lines[3].startswith("TABLE = [(1, 'cj") and '"a"' not in new_lines[3]
  for expected in ('"a"', '"bb"', "2.5", "0.3", "'bb'"):
    # The hidden expected values are nowhere in the real tests' code.
    assert expected not in "\n".join(new_lines[7:37]), expected
  assert '"loop"' not in new
  # Renamed: no F2P function keeps the name the problem statement lists.
  tree = ast.parse(new)
  defs = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
  assert not {"test_table", "test_literal", "test_method", "test_raises", "test_shared"} & defs
  assert {"test_called_elsewhere", "test_user", "test_shared_len"} <= defs  # untouched


def test_sites_and_tables(plan):
  sites = collections.Counter((s.table, s.approx is not None) for s in plan.sites.values())
  # test_literal's dict and approx, the unittest assertEqual, test_loop's (not required),
  # test_called_elsewhere's (kept name), test_table's hidden column.
  assert sites == {(False, False): 4, (False, True): 1, (True, False): 1}
  assert {tuple(v[0]): v[1] for v in plan.tokens.values()} == {
    ("tests/test_m.py::test_table[1-a]",): "a",
    ("tests/test_m.py::test_table[2-bb]",): "bb",
  }
  # Every run id of a table row maps back to its original id, and the token is in the id.
  for tok, (ids, _) in plan.tokens.items():
    new = plan.ids[ids[0]]
    assert tok in new and plan.split(new) == ("real", ids[0], instrument.split_id(new)[1])
  assert all(plan.required.values())
  # Required sites belong to functions (file::chain::name) and every id names its own.
  assert set(plan.required) == {
    "tests/test_m.py::test_table",
    "tests/test_m.py::test_literal",
    "tests/test_m.py::TestCase::test_method",
    "tests/test_m.py::test_called_elsewhere",
  }
  assert plan.owner["tests/test_m.py::test_table[2-bb]"] == "tests/test_m.py::test_table"
  assert "tests/test_m.py::test_user" not in plan.owner  # not rewritten


def _sentinels(source: str) -> set:
  """Test functions whose whole body is `assert <int> == <int>`."""
  return {
    n.name
    for n in ast.walk(ast.parse(source))
    if isinstance(n, ast.FunctionDef)
    and len(n.body) == 1
    and isinstance(n.body[0], ast.Assert)
    and all(isinstance(x, ast.Constant) for x in (n.body[0].test.left, *n.body[0].test.comparators))
  }


def test_decoys(plan):
  new = plan.files["tests/test_m.py"].decode()
  sentinels = _sentinels(new)
  assert len(sentinels) == 1 and sentinels <= set(plan.decoys)  # one per file, always
  twins = collections.Counter(plan.names[t] for d, t in plan.decoys.items() if d not in sentinels)
  # The shared table cannot leave the process: two decoys (copies before and after it).
  assert twins == {"test_shared": 2}
  first = new.splitlines()[4]
  assert first.endswith("SHARED = [(3, 9.0), (4, 16.0)]") and first.count("=") == 2
  assert "finally:" not in new and "raise AssertionError()" not in new
  assert len(plan.decoy_ids) == 3 and all(plan.split(i)[0] == "decoy" for i in plan.decoy_ids)
  # The pytest.raises test has nothing to compare, the loop's site may never run: neither
  # has a check reached for sure that the host or a decoy judges, so neither is graded (a
  # decoy that fails by a `raise` of its own would be told from the real test by its code).
  why = "no decoy: no comparison a decoy can perturb: the pass would be the process's word"
  assert plan.unprotected == {
    "tests/test_m.py::TestCase::test_raises": why,
    "tests/test_m.py::test_loop": why,
  }
  # A function whose name the file uses again keeps it, and is protected by its hidden site.
  assert "test_called_elsewhere" not in plan.names.values()


def test_a_kept_name_without_hidden_values_is_unprotected():
  """Decoys of a test that keeps its name would not tell tampering aimed at that name: such
  a function is protected only by hidden expected values, else listed as unprotected."""
  src = (
    b"import pytest\n\n\ndef test_x():\n  with pytest.raises(ValueError):\n    f()\n\n\n"
    b"NAMES = ['test_x']\n\n\ndef test_y():\n  assert f() == 2\n\n\nALSO = ['test_y']\n"
  )
  f2p = ["tests/test_k.py::test_x", "tests/test_k.py::test_y"]
  p = instrument.plan({"tests/test_k.py": src}, f2p, f2p, rng=random.Random(0))
  assert p.unprotected == {
    f2p[0]: "its name is used 1 more times in the file; no expected value to hide; "
    "not renamed: named other than by a definition at tests/test_k.py:9"
  }
  assert p.names == {} and set(p.required) == {f2p[1]} and p.owner == {f2p[1]: f2p[1]}


def test_perturbed_values_differ():
  rng = random.Random(0)
  for v in [0, -7, 2**70, 0.0, -1.5, 1e308, float("inf"), 1j, "", "é", b"", True, False, None,
            [], [1], (), (1, "a"), {}, {"a": 1}, set(), frozenset({1})]:  # fmt: skip
    p = site_values.perturb(v, rng)
    assert p != v and v != p and site_values.plain(p), (v, p)


class Int:
  """A project integer type that equals the int it holds (pyasn1's univ.Integer does): its
  readings are its own methods, which the candidate can replace at run time, so it has none."""

  def __init__(self, v):
    self.v = v

  def __int__(self):
    return self.v

  def __eq__(self, other):
    return int(other) == self.v if isinstance(other, (int, Int)) else NotImplemented

  __hash__ = None


class Any:
  def __eq__(self, other):
    return True


class Hedge:
  """A value with a different answer for every reading, equal to each of them (and to
  nothing else, so no sentinel catches it): several guesses at once."""

  GUESSES = (-1, 0.0, 1, "1", (1,), b"1", True)

  def __int__(self):
    return -1

  def __index__(self):
    return 1

  def __float__(self):
    return 0.0

  def __complex__(self):
    return 1j

  def __str__(self):
    return "1"

  __repr__ = __str__

  def __bytes__(self):
    return b"1"

  def __bool__(self):
    return True

  def __len__(self):
    return 1

  def __iter__(self):
    return iter((1,))

  def __eq__(self, other):
    return any(type(other) is type(g) and other == g for g in self.GUESSES)

  def __hash__(self):
    return 1


def _subclass(base, value, **methods):
  return type(f"My{base.__name__}", (base,), methods)(value)


NUMPY_LIKE = type(
  "float64",
  (),
  {
    "__float__": lambda s: 10.0,
    "__index__": lambda s: 10,
    "item": lambda s: 10.0,
    "__array__": lambda s, *a: [10.0],
    "__eq__": lambda s, o: o in (10.0, 10),
    "__hash__": lambda s: 10,
  },
)()


@pytest.mark.parametrize(
  "value,expected,equal",
  [
    (1.0, 1, True),
    (True, 1, True),
    ("abc", "abc", True),
    ({"a": [1, (2, 3)]}, {"a": [1, (2, 3)]}, True),
    (decimal.Decimal("0.5"), 0.5, True),
    (fractions.Fraction(1, 2), 0.5, True),
    (fractions.Fraction(1, 3), 1 / 3, False),
    ({1, 2}, {2, 1}, True),
    ([1, 2], (1, 2), False),
    (object(), None, False),
    # No canonical reading: subclasses of builtins and objects that answer for themselves.
    (collections.OrderedDict(a=[1, (2, 3)]), {"a": [1, (2, 3)]}, False),
    (Int(12), 12, False),
    (NUMPY_LIKE, 10.0, False),
    (_subclass(int, 3, __float__=lambda s: 4.0, __eq__=lambda s, o: o in (3, 4)), 4.0, False),
    (_subclass(int, 3), 3, False),
    (_subclass(float, 2.5), 2.5, False),
    (_subclass(str, "hello ada", __str__=lambda s: "hi ada"), "hi ada", False),
    (_subclass(str, "hello ada", __str__=lambda s: "hi ada"), "hello ada", False),
    (_subclass(tuple, (1, 2), __iter__=lambda s: iter((3, 4))), (3, 4), False),
    (_subclass(tuple, (1, 2), __iter__=lambda s: iter((3, 4))), (1, 2), False),
    (_subclass(list, [1], __len__=lambda s: 2), [1], False),
    (_subclass(dict, {"k": 1}, items=lambda s: [("k", 2)]), {"k": 2}, False),
    (_subclass(int, 1, __bool__=lambda s: False), 1, False),
    ([1, _subclass(int, 2)], [1, 2], False),  # inside a container too
    ({"k": Int(1)}, {"k": 1}, False),
  ]
  + [(Hedge(), g, False) for g in Hedge.GUESSES],
)
def test_site_values_have_one_canonical_reading(value, expected, equal):
  """Only exact builtins are read (through the builtins' own accessors, never the value's
  methods); the host compares that one reading with the expected value as Python would."""
  rec = site_values.encode_site_value(value)
  site = instrument.Site(expected, None, "x")
  assert not rec["liar"]
  assert instrument.matches(site, expected, rec["value"], site_values.decode) is equal
  assert (rec["value"] is None) is (not site_values.plain(value) and type(value) not in (
    decimal.Decimal, fractions.Fraction))  # fmt: skip


def test_a_fraction_is_read_through_its_slots_not_its_properties(monkeypatch):
  monkeypatch.setattr(fractions.Fraction, "numerator", property(lambda s: 7))
  rec = site_values.encode_site_value(fractions.Fraction(1, 2))
  assert rec["value"] == ["Q", "1", "2"]


def test_lying_values_are_caught():
  import unittest.mock

  for liar in (Any(), unittest.mock.ANY, type("F", (float,), {"__eq__": lambda s, o: True})(0)):
    assert site_values.encode_site_value(liar)["liar"]
  approx = pytest.approx(0.0, abs=float("inf"))
  assert site_values.encode_site_value(approx)["liar"]
  site = instrument.Site(0.3, (("rel", 1e-3),), "x")
  assert instrument.matches(
    site, 0.3, site_values.encode_site_value(0.30001)["value"], site_values.decode
  )


def test_decode_refuses_what_it_does_not_know():
  for bad in (["x"], [], "s", ["i", 1], ["l", "notalist"], ["d", [[["s", "k"]]]], None):
    with pytest.raises((ValueError, TypeError)):
      site_values.decode(bad)


def test_a_function_also_run_in_another_file_is_renamed_with_its_ids_or_kept():
  """A test class imported into (or inherited by) another file runs there under its method
  names: a method with hidden sites keeps its name; one without is renamed, with every id
  that runs it, and its decoy runs in each of their classes — unless another file names it
  (after a rename that name would run nothing), then it is unprotected. A same-named function
  the other file defines itself does not stop a rename."""
  base = (
    b"import pytest\n\n\nclass TestBase:\n  def test_x(self):\n    assert f() == 1\n\n"
    b"  def test_z(self, want):\n    assert f() == want\n\n\n"
    b"def test_y():\n  assert f() == 2\n"
  )
  sub = b"from tests.test_base import TestBase\n\n\nclass TestSub(TestBase):\n  pass\n\n\ndef test_y():\n  pass\n"
  f2p = [
    "tests/test_base.py::TestBase::test_x",
    "tests/test_base.py::TestBase::test_z",
    "tests/test_base.py::test_y",
  ]
  ids = [
    *f2p,
    *(f"tests/test_sub.py::TestSub::{n}" for n in ("test_x", "test_z")),
    "tests/test_sub.py::test_y",
  ]
  files = {"tests/test_base.py": base, "tests/test_sub.py": sub}
  p = instrument.plan(files, f2p, ids, rng=random.Random(0))
  assert p.unprotected == {}
  assert set(p.required) == {f2p[0], f2p[2]}
  new = {old: n for n, old in p.names.items()}
  assert sorted(new) == ["test_y", "test_z"]
  assert p.ids[f2p[0]] == f2p[0] and p.ids[f2p[2]] == f"tests/test_base.py::{new['test_y']}"
  assert p.ids[f2p[1]] == f"tests/test_base.py::TestBase::{new['test_z']}"
  assert p.ids[ids[4]] == f"tests/test_sub.py::TestSub::{new['test_z']}"
  assert p.owner[ids[4]] == f2p[1] and p.run_ids(ids)[3] == ids[3]
  (decoy,) = [d for d, twin in p.decoys.items() if twin == new["test_z"]]
  assert f"tests/test_base.py::TestBase::{decoy}" in p.decoy_ids
  assert f"tests/test_sub.py::TestSub::{decoy}" in p.decoy_ids
  elsewhere = "also run in another file (imported or inherited)"
  named = sub + b"\n\nSLOW = ['test_z']\n"
  p = instrument.plan({**files, "tests/test_sub.py": named}, f2p, ids, rng=random.Random(0))
  assert p.unprotected == {
    f2p[1]: f"{elsewhere}; no expected value to hide; "
    "not renamed: named other than by a definition at tests/test_sub.py:12"
  }
  # Without the other file's source, its ids are taken as running the base's methods.
  assert f2p[1] in instrument.plan({"tests/test_base.py": base}, f2p, ids).unprotected


def test_a_test_defined_in_another_file_gets_its_sites_there():
  """A function its test module imports, or a method of a class it imports or inherits from,
  is rewritten where it is defined (the one definition of that name beside it), under its own
  name: its ids are judged by the hidden sites there."""
  helper = (
    b"import pytest\nfrom pkg import f\n\n\ndef test_imp():\n  assert f() == 3\n\n\n"
    b"class TestBase:\n  def test_m(self):\n    assert f() == 4\n\n"
    b"  def test_raises(self, want):\n    assert f() == want\n"
  )
  test = (
    b"from checks import TestBase, test_imp  # noqa: F401\n\n\nclass TestSub(TestBase):\n  pass\n"
  )
  f2p = [
    "tests/test_x.py::test_imp",
    "tests/test_x.py::TestBase::test_m",
    "tests/test_x.py::TestSub::test_m",
    "tests/test_x.py::TestSub::test_raises",
  ]
  files = {"tests/checks.py": helper, "tests/test_x.py": test}
  p = instrument.plan(files, f2p, f2p, rng=random.Random(0))
  assert p.unprotected == {}
  assert p.owner == {
    f2p[0]: "tests/checks.py::test_imp",
    f2p[1]: "tests/checks.py::TestBase::test_m",
    f2p[2]: "tests/checks.py::TestBase::test_m",
    f2p[3]: "tests/checks.py::TestBase::test_raises",
  }
  assert set(p.required) == {"tests/checks.py::test_imp", "tests/checks.py::TestBase::test_m"}
  new = p.files["tests/checks.py"].decode()
  assert "== 3" not in new and "== 4" not in new and "def test_imp" in new
  # test_raises has no hidden value: renamed with its id, a decoy beside it.
  (renamed,) = p.names
  assert p.names[renamed] == "test_raises" and f"def {renamed}(self, want)" in new
  assert p.ids[f2p[3]] == f"tests/test_x.py::TestSub::{renamed}"
  # The decoy and the sentinel go to the file that runs them (the helper is not collected).
  assert [i.split("::")[0] for i in p.decoy_ids] == ["tests/test_x.py"] * 2
  # A function imported by name cannot be renamed (the import would fail): unprotected.
  flag = b"\n\ndef test_flag(want):\n  assert f() == want\n"
  importing = test.replace(b"test_imp ", b"test_imp, test_flag ")
  both = {"tests/checks.py": helper + flag, "tests/test_x.py": importing}
  assert instrument.plan(both, ["tests/test_x.py::test_flag"], f2p).unprotected == {
    "tests/test_x.py::test_flag": "defined in tests/checks.py: also run in another file "
    "(imported or inherited); no expected value to hide; "
    "not renamed: named other than by a definition at tests/test_x.py:1"
  }
  # Two definitions of the name beside it: neither is taken.
  twice = {**files, "tests/more.py": b"def test_imp():\n  assert f() == 5\n"}
  assert instrument.plan(twice, f2p[:1], f2p[:1]).unprotected == {
    f2p[0]: "definition not found in the file"
  }


def test_an_inherited_test_is_found_along_the_method_resolution_order():
  """A test class's methods found up its ancestry across files, at any depth (itsdangerous:
  TestURLSafeTimedSerializer(TestURLSafeSerializer, TestTimedSerializer), each base in a file
  of its own, running TestSerializer's methods), and the definition Python runs where bases
  override one another (C3: in a diamond, the second base's override before the shared base's
  method; a depth-first walk takes the shared one)."""
  base = (
    b"class Checks:\n  def test_x(self):\n    assert f() == 1\n\n"
    b"  def test_d(self):\n    assert f() == 2\n\n\n"
    b"class Left(Checks):\n  pass\n\n\n"
    b"class Right(Checks):\n  def test_d(self):\n    assert f() == 3\n"
  )
  mid = b"from tests.base import Checks\n\n\nclass More(Checks):\n  pass\n"
  test = (
    b"from tests.mid import More\nfrom tests.base import Left, Right\n\n\n"
    b"class Local(More):\n  pass\n\n\nclass TestDeep(Local):\n  pass\n\n\n"
    b"class TestDiamond(Left, Right):\n  pass\n"
  )
  f2p = [
    "tests/test_a.py::TestDeep::test_x",
    "tests/test_a.py::TestDiamond::test_d",
    "tests/test_a.py::More::test_x",
  ]
  files = {"tests/base.py": base, "tests/mid.py": mid, "tests/test_a.py": test}
  p = instrument.plan(files, f2p, f2p, rng=random.Random(0))
  assert p.unprotected == {}
  assert p.owner == {
    f2p[0]: "tests/base.py::Checks::test_x",
    f2p[1]: "tests/base.py::Right::test_d",
    f2p[2]: "tests/base.py::Checks::test_x",
  }
  assert set(p.required) == {"tests/base.py::Checks::test_x", "tests/base.py::Right::test_d"}
  new = p.files["tests/base.py"].decode()
  assert "== 1" not in new and "== 3" not in new and "== 2" in new  # Checks.test_d is not run
  # A base of the same name in two other files, or an order C3 refuses: not taken.
  twice = {**files, "tests/other.py": b"class More:\n  def test_x(self):\n    assert f() == 5\n"}
  cyclic = {**files, "tests/mid.py": mid.replace(b"(Checks)", b"(Checks, Local)")}
  for bad in (twice, cyclic):
    assert instrument.plan(bad, f2p[:1], f2p[:1]).unprotected == {
      f2p[0]: "definition not found in the file"
    }


# Shapes of pinned suites where other classes define a hidden test's name (#22): PyHamcrest's
# HasPropertyTest / HasPropertiesTest (two unrelated classes of one file), itsdangerous'
# TestTimestampSigner / TestTimedSerializer.test_max_age (the same, one of them inherited by a
# class of another file), and overrides along the class hierarchy.
RAISES = "    assert f() == want\n"
BASE = (
  "import pytest\n\n\nclass Checks:\n  def test_x(self, want):\n" + RAISES + "\n\n"
  "class TestOther:\n  def test_x(self):\n    g()\n\n\n"
  "class TestChecks(Checks):\n  pass\n\n\n"
  "class TestOverride(Checks):\n  def test_x(self):\n    h()\n\n\n"
  "class TestOverrideInherited(TestOverride):\n  pass\n"
).encode()
SUB = (
  b"from tests.test_base import Checks, TestOther\n\n\nclass TestMore(Checks):\n  pass\n\n\n"
  b"class TestLookalike:\n  def test_x(self):\n    g()\n\n\n"
  b"class TestMixed(TestOther, Checks):\n  pass\n\n\n"
  b"class TestLoud(Checks):\n  def test_x(self):\n    h()\n"
)
HIDDEN = "tests/test_base.py::TestChecks::test_x"
IDS = [
  *(f"tests/test_base.py::{c}::test_x" for c in ("TestChecks", "TestOther", "TestOverride")),
  "tests/test_base.py::TestOverrideInherited::test_x",
  *(f"tests/test_sub.py::{c}::test_x" for c in ("TestMore", "TestLookalike", "TestMixed")),
  "tests/test_sub.py::TestLoud::test_x",
]


@pytest.mark.parametrize("other_file", [False, True])
def test_same_named_methods_of_other_classes_do_not_stop_a_rename(other_file):
  """A hidden test without a hidden value whose name other classes also define — an
  unrelated class (in its file, or another), a class whose MRO reaches another definition
  first (TestMixed: TestOther's), overrides (TestOverride, TestLoud) — is renamed with exactly
  the ids its class hierarchy says run it (TestChecks, TestMore: they inherit it); every other
  id keeps its name and runs what it ran. On the old code the task was refused ('its name is
  used 4 more times in the file' / 'also run in another file')."""
  # A module path that holds the name names no method (itsdangerous: test_serializer).
  modules = b"\n\nfrom tests.test_x import helper  # noqa: E402, F401\n"
  files = {"tests/test_base.py": BASE, "tests/test_sub.py": SUB + modules}
  if not other_file:  # one file: the other file's classes moved into it
    sub = (SUB + modules).split(b"\n", 1)[1]
    files = {"tests/test_base.py": BASE + sub}
  ids = IDS if other_file else [i.replace("test_sub.py", "test_base.py") for i in IDS]
  p = instrument.plan(files, [HIDDEN], ids, rng=random.Random(0))
  assert p.unprotected == {}
  (new,) = p.names
  assert p.names[new] == "test_x" and new != "test_x"
  more = ids[4]  # TestMore::test_x
  assert p.ids == {
    HIDDEN: HIDDEN.replace("::test_x", f"::{new}"),
    more: more.replace("test_x", new),
  }
  assert p.owner[HIDDEN] == p.owner[more] == "tests/test_base.py::Checks::test_x"
  assert p.run_ids(ids)[1:4] + p.run_ids(ids)[5:8] == [*ids[1:4], *ids[5:8]]
  # Only Checks' definition is renamed; the decoy runs in the two classes that run it.
  new_src = b"".join({**files, **p.files}.values()).decode()
  assert new_src.count(f"def {new}(self, want)") == 1 and new_src.count("def test_x(self)") == 4
  (decoy,) = [d for d, twin in p.decoys.items() if twin == new]
  assert sorted(i for i in p.decoy_ids if decoy in i) == sorted(
    [HIDDEN.replace("test_x", decoy), more.replace("test_x", decoy)]
  )


# (what the other file says instead, why the rename is not taken): an override reaching it
# by name (super() would reach nothing after a rename), a name built at run time, a star
# import or a plain name bound to another module's class than resolve() finds (either could
# bind the base to another class), a dynamic base or a metaclass (the MRO is not the
# syntax's), a base from outside the test modules (it may define the name).
STOPS = {
  "override_calls_it": (
    b"    h()\n",
    b"    super().test_x()\n",
    "named other than by a definition at tests/test_sub.py:19 (an override of it calls it by name)",
  ),
  "built_name": (
    b"class TestLookalike:",
    b"T = getattr(Checks, 'test_' + N)\nclass TestLookalike:",
    "names may be built at run time at tests/test_sub.py:8 (getattr with a computed name)",
  ),
  "star_import": (
    b"import Checks, TestOther",
    b"import *",
    "tests/test_sub.py::TestMixed::test_x: tests/test_sub.py:1 has a star import",
  ),
  "dynamic_base": (
    b"TestMore(Checks)",
    b"TestMore(bases()[0])",
    "tests/test_sub.py::TestMore::test_x: "
    "tests/test_sub.py:4 class TestMore has a dynamic base bases()[0]",
  ),
  "metaclass": (
    b"TestMore(Checks)",
    b"TestMore(Checks, metaclass=M)",
    "tests/test_sub.py::TestMore::test_x: "
    "tests/test_sub.py:4 class TestMore has class keywords (a metaclass)",
  ),
  "other_module": (
    b"from tests.test_base",
    b"from mylib",
    "tests/test_sub.py::TestMixed::test_x: "
    "tests/test_sub.py:13 class TestMixed: base TestOther is not the class of "
    "tests/test_base.py",
  ),
  "outside_base": (
    b"TestMore(Checks)",
    b"TestMore(Outside, Checks)",
    "tests/test_sub.py::TestMore::test_x: "
    "tests/test_sub.py:4 class TestMore: base Outside is not bound by a "
    "plain import",
  ),
}


@pytest.mark.parametrize("case", sorted(STOPS))
def test_a_same_named_method_that_may_reach_it_keeps_it_unprotected(case):
  """Where the hierarchy or the names cannot be known for sure, the hidden test keeps its
  name and is unprotected (the task refused), the reason naming the case."""
  old, new, why = STOPS[case]
  sub = SUB.replace(old, new)
  assert sub.count(new) == 1 and SUB.count(old) == 1
  p = instrument.plan(
    {"tests/test_base.py": BASE, "tests/test_sub.py": sub}, [HIDDEN], IDS, rng=random.Random(0)
  )
  kept = "also run in another file (imported or inherited); no expected value to hide; "
  kept += "not renamed: "
  assert p.unprotected == {HIDDEN: kept + why} and p.names == {}


def test_a_base_from_the_standard_library_is_known():
  """unittest.TestCase defines no test: an MRO through it is known (cachetools' CacheTest(
  unittest.TestCase, CacheTestMixin) runs CacheTestMixin's tests); a base of that name from
  elsewhere is not."""
  sub = SUB.replace(b"class TestMore(Checks)", b"class TestMore(unittest.TestCase, Checks)")
  files = {"tests/test_base.py": BASE, "tests/test_sub.py": b"import unittest\n" + sub}
  p = instrument.plan(files, [HIDDEN], IDS, rng=random.Random(0))
  assert p.unprotected == {} and IDS[4] in p.ids
  files["tests/test_sub.py"] = b"import mylib as unittest\n" + sub
  p = instrument.plan(files, [HIDDEN], IDS, rng=random.Random(0))
  assert "base unittest.TestCase is not bound by a plain import" in p.unprotected[HIDDEN]
