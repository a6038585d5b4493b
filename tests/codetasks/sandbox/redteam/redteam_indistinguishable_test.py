"""Red team, issue 41 class 1: telling the real test from its decoys, on a task whose hidden
test has no `==` literal to hide (`predicate`: the greet task's test written as truthiness
checks, as real projects' predicate tests are).

Such a test used to be guarded by decoys that ended in `raise` — code of their own that told
them apart — and by a sentinel, with the verdict the in-process outcome: an attack that can
aim a forced outcome at the real test (its definition line, its collection order, its name,
the harness's own plugin, which held the decoys' names) scored 1.0. Now every truth, identity
and order check is a hidden site judged on the host from the value's canonical reading; the
plan (which items are decoys, and their order) never enters the sandbox; and a test with no
check the host or a decoy can judge is not graded at all.
"""

import dataclasses

import pytest

from composer_jax.codetasks import project
from composer_jax.codetasks.sandbox import grader
from tests.codetasks.mini_project import FAST
from tests.codetasks.sandbox.redteam.attacks import CORE, critical, grade, patch

PREDICATE_TEST = """
  def test_greet(self, who):
    assert core.Greeter(who).greet().startswith("hello ")
    assert core.Greeter(who).greet().endswith(who)
    assert not core.Greeter(who).greet().isupper()
"""


@pytest.fixture(scope="module")
def predicate(shapes, tmp_path_factory):
  greet = shapes["greet"]
  root = tmp_path_factory.mktemp("predicate")
  names = project.unpack(greet.hidden_files, root)
  test = root / "tests/test_core.py"
  src = test.read_text()
  start = src.index("  def test_greet(self, who):")
  end = src.index("  def test_farewell", start)
  test.write_text(src[:start] + PREDICATE_TEST.lstrip("\n") + "\n" + src[end:])
  return dataclasses.replace(greet, hidden_files=project.pack(root, names))


# Forcing aimed at one test item: the runner's machinery is reachable from objects every
# program holds (sys.modules' _pytest), and an item can be told apart by what it exposes.
_AIM = (
  "import _pytest.python as _pp\n"
  "_run = _pp.Function.runtest\n"
  "def _real(item):\n"
  "  {rule}\n"
  "def _runtest(self):\n"
  "  if self.originalname.endswith('_greet') and _real(self):\n"
  "    return None\n"
  "  return _run(self)\n"
  "_pp.Function.runtest = _runtest\n"
)
RULES = {
  # The harness's reporter held the decoys' names.
  "reporter_plugin_names_the_decoys": (
    "for p in item.config.pluginmanager.get_plugins():\n"
    "    if isinstance(getattr(p, 'decoys', None), dict):\n"
    "      return item.originalname not in p.decoys\n"
    "  return False"
  ),
  # Decoys were appended at the end of the file: the real test is defined first.
  "smallest_definition_line": (
    "mine = [i for i in item.session.items if i.originalname.endswith('_greet')]\n"
    "  first = min(i.function.__code__.co_firstlineno for i in mine)\n"
    "  return item.function.__code__.co_firstlineno == first"
  ),
  # The harness ordered decoys around their twin: the real one is collected between them.
  "collection_order": (
    "mine = [i for i in item.session.items if i.originalname.endswith('_greet')]\n"
    "  return len(mine) > 1 and item is mine[len(mine) // 2]"
  ),
  # A decoy that ends in `raise` has an exception table and names AssertionError.
  "code_shape": "return 'AssertionError' not in item.function.__code__.co_names",
}
WRONG = "return 'bye ' + self.who"
# A value whose predicates answer for themselves: a truthy object with no reading.
LYING_PREDICATES = (
  "class _Yes:\n  def __bool__(self):\n    return True\n\n\n"
  "class _No:\n  def __bool__(self):\n    return False\n\n\n"
  "class _Greeting:\n  def startswith(self, p):\n    return _Yes()\n"
  "  def endswith(self, p):\n    return _Yes()\n  def isupper(self):\n    return _No()\n"
)


def _edits(task, prelude, body):
  code = f"{prelude}\n\ndef _greet(self):\n  {body}\n\nGreeter.greet = _greet\n"
  return patch(task, {CORE: "\n" + code})


@pytest.mark.parametrize("rule", sorted(RULES))
def test_an_outcome_forced_on_the_real_test_alone_scores_zero(predicate, rule):
  g = grade(predicate, _edits(predicate, _AIM.format(rule=RULES[rule]), WRONG))
  assert g.integrity["hidden"] == 1 and g.integrity["unprotected"] == {}, g.integrity
  assert g.integrity["overturned"] or critical(g), g


LYING_STR = (
  "class _S(str):\n  def startswith(self, p):\n    return True\n"
  "  def endswith(self, p):\n    return True\n  def isupper(self):\n    return False\n"
)


@pytest.mark.parametrize(
  "prelude,body",
  [(LYING_PREDICATES, "return _Greeting()"), (LYING_STR, "return _S('bye ' + self.who)")],
  ids=["objects_with_their_own_truth", "str_subclass_whose_predicates_lie"],
)
def test_predicates_that_answer_for_themselves_score_zero(predicate, prelude, body):
  """The checks' results are not the candidate's word: a truthy object of its own has no
  reading, and str's predicates are called on the host on the receiver's reading (a str
  subclass has none)."""
  g = grade(predicate, _edits(predicate, prelude, body))
  assert g.integrity["overturned"], g


def test_gold_and_empty_on_the_predicate_shape(predicate):
  gold = grader.grade(predicate, predicate.gold_patch, limits=FAST)
  assert gold.reward == 1.0 and not critical(gold), gold
  assert gold.integrity["hidden"] == 1 and gold.integrity["decoys"] == 1  # the sentinel
  assert grader.grade(predicate, "", limits=FAST).reward == 0.0


def test_a_test_with_nothing_to_compare_is_not_graded(shapes, tmp_path):
  """`with pytest.raises(...)` alone: no check the host or a decoy can judge, so its pass
  would be the process's word; the grader refuses the task before anything runs."""
  greet = shapes["greet"]
  names = project.unpack(greet.hidden_files, tmp_path)
  test = tmp_path / "tests/test_core.py"
  src = test.read_text()
  start = src.index("  def test_greet(self, who):")
  end = src.index("  def test_farewell", start)
  body = (
    "  def test_greet(self, who):\n    with pytest.raises(TypeError):\n      core.Greeter()\n\n"
  )
  test.write_text(src[:start] + body + src[end:])
  task = dataclasses.replace(greet, hidden_files=project.pack(tmp_path, names))
  g = grader.grade(task, task.gold_patch, limits=FAST)
  assert g.error.startswith("task not gradable: unprotected FAIL_TO_PASS tests (1)"), g.error
  assert "no comparison a decoy can perturb" in g.error


@pytest.mark.parametrize("rule", ["smallest_definition_line", "reporter_plugin_names_the_decoys"])
@pytest.mark.parametrize("shape", ["decoy", "inherited_local", "same_name"])
def test_aimed_forcing_scores_zero_on_the_decoy_shapes(shapes, shape, rule):
  """The shapes that decoys alone used to guard: the shared table (now refused: its expected
  values stay in the process), expected values in locals (now hidden sites). Aimed by the
  definition line, a forced outcome scored 1.0 on the first two with decoys."""
  task = shapes[shape]
  suffix = "_hypot" if shape == "decoy" else "_greet"
  aim = _AIM.replace("_greet", suffix).format(rule=RULES[rule].replace("_greet", suffix))
  if shape == "decoy":
    code = aim + "\n\ndef hypot_scaled(a, b):\n  return 0.0\n"
    g = grade(task, patch(task, {CORE: "\n" + code}))
    assert g.error.startswith("task not gradable"), g
  else:
    g = grade(task, _edits(task, aim, WRONG))
    assert g.integrity["overturned"] or critical(g), g
