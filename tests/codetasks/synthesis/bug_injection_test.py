"""Bug injection: each mutation kind against hand-written expected code; bug tasks on the mini
project validated like deletions (gold 1.0, empty 0.0, direct tests, behaviour-only statement)."""

import dataclasses
import textwrap
import types

import pytest

from composer_jax.codetasks.synthesis import bug_injection, difficulty, generator

CODE = textwrap.dedent(
  """\
  def f(a, b, xs):
    if a < b and a in xs:
      return xs[0] + g(a, b)
    elif a == b:
      y = 1 if a is None else 2
    while b:
      b = b // 2
    if y:
      y = 0
    return max(a, b) * range(3)[1]
  """
)


def _by_kind(muts):
  out = {}
  for m in muts:
    out.setdefault(m.kind, []).append((m.before, m.after))
  return out


def test_every_kind_on_hand_written_sites():
  got = _by_kind(bug_injection.mutations(CODE, set(range(2, 11))))
  assert got["operator"] == [
    ("a < b and a in xs", "a < b or a in xs"),
    ("a < b", "a > b"),
    ("a in xs", "a not in xs"),
    ("xs[0] + g(a, b)", "xs[0] - g(a, b)"),
    ("a == b", "a != b"),
    ("a is None", "a is not None"),
    ("b // 2", "b * 2"),
    ("max(a, b) * range(3)[1]", "max(a, b) // range(3)[1]"),
  ]
  assert got["off_by_one"] == [("a < b", "a <= b"), ("0", "1"), ("3", "4"), ("1", "2")]
  assert [a.splitlines()[0] for _, a in got["condition"]] == [
    "if not (a < b and a in xs):",
    "if not (a == b):",
    "1 if not (a is None) else 2",
    "while not b:",
    "if not y:",
  ]
  # The if/elif loses its elif; the lone `if y:` (not alone in its block) goes entirely.
  assert [a for _, a in got["removed_branch"]][1] == ""
  assert "elif" not in got["removed_branch"][0][1]
  # g(a, b) swaps; max(a, b) is symmetric and is left alone.
  assert got["swapped_arguments"] == [("g(a, b)", "g(b, a)")]


def test_only_listed_lines_and_whole_module_code():
  muts = bug_injection.mutations(CODE, {7})
  assert [(m.kind, m.before, m.after) for m in muts] == [("operator", "b // 2", "b * 2")]
  assert muts[0].new_code == CODE.replace("b = b // 2", "b = b * 2")


@pytest.fixture(scope="module")
def bug_tasks(mini_gen):
  gen, _ = mini_gen
  saved = gen.cfg
  gen.cfg = dataclasses.replace(saved, methods=("bug",), max_attempts=6)
  try:
    return gen, gen.generate(), list(gen.log)
  finally:
    gen.cfg = saved


def test_bug_tasks_validate(bug_tasks):
  gen, tasks, log = bug_tasks
  assert tasks, log
  for t in tasks:
    assert t.method == "bug" and t.provenance["verify"]["gold"] == 1.0
    assert t.provenance["verify"]["empty"] == 0.0
    (feat,) = t.features
    assert feat["mutation"] in bug_injection.KINDS and feat["kind"] in ("function", "method")
    mapped = set(gen.map.tests_by_symbol[f"{feat['path']}::{feat['qualname']}"])
    assert t.F2P_direct == [x for x in t.FAIL_TO_PASS if x in mapped] and t.F2P_direct
    assert t.difficulty == difficulty.fields(t, _texts(gen))
    # The statement names failing tests, never the changed code.
    assert "Hidden tests that will be run:" in t.problem_statement
    changed = [ln for ln in t.gold_patch.splitlines() if ln[:1] in "+-" and ln[:3] not in "+++---"]
    assert changed and not any(ln[1:].strip() in t.problem_statement for ln in changed)


def _texts(gen):
  return {f: (gen.orig / f).read_text() for f in gen.project.files}


def test_failure_messages_from_sections_and_summary():
  tail = textwrap.dedent(
    """\
    ______________________ TestGreeter.test_greet[ada] ______________________
        def test_greet(self, who):
    >     assert core.Greeter(who).greet() == "hello ada"
    E     AssertionError: assert 'bye ada' == 'hello ada'
    =========================== short test summary info ============================
    FAILED tests/test_core.py::TestGreeter::test_greet[ada] - AssertionError: asse...
    FAILED tests/test_core.py::test_hypot[3-4-10.0] - TypeError: unsupported operand...
    FAILED tests/test_other.py::test_not_hidden - ValueError: x
    """
  )
  f2p = [
    "tests/test_core.py::TestGreeter::test_greet[ada]",
    "tests/test_core.py::test_hypot[3-4-10.0]",
  ]
  got = generator._failure_messages([types.SimpleNamespace(log_tail=tail)], f2p)
  assert got == [
    "tests/test_core.py::TestGreeter::test_greet: AssertionError: assert 'bye ada' == 'hello ada'",
    "tests/test_core.py::test_hypot: TypeError: unsupported operand",
  ]


def test_bug_tasks_get_no_deletion_variant(bug_tasks):
  gen, tasks, _ = bug_tasks
  assert gen.harder(tasks[0]) == []
