"""Every red-team test: nothing written outside the sandbox, every grader temp dir removed.

`shapes`: the mini project's deleted features in the three shapes the grader handles
differently: `greet` (the hidden test compares with a literal: a hidden site), `hypot` (a
parametrized expected value: a hidden table), `decoy` (the hypot task with its table shared
by another test, so the values stay in the process and decoys guard the test), `bare` (the
hypot task whose test's name also appears elsewhere in its file, so it keeps its name: its
table is hidden, and decoys could not guard it), `imported` (the hypot task whose test is
defined in another file and imported into its test module: nothing can be rewritten, so the
grader refuses to grade it and the factory never emits it: its expected values are a
table, which cannot be hidden for a test another file runs), `imported_greet` (the greet
task's test class defined in another file and imported: its literal is hidden there),
`inherited_greet` (its methods two files and two classes up the test class's ancestry, as
itsdangerous' suite has them: hidden where they are defined), `inherited_local` (the same
with each expected value in a local variable, so nothing can be hidden: the inherited methods
are renamed with their ids and guarded by decoys), `same_name` (inherited_local's TestGreeter
back in tests/test_core.py, beside an unrelated class defining the same test names, and
subclassed in tests/test_loud.py by a class that overrides one of them and inherits the
other, and by an unrelated lookalike there: PyHamcrest's and itsdangerous' layouts).
"""

import dataclasses
import os
import re
import tempfile

import pytest

from composer_jax.codetasks import project
from composer_jax.codetasks.sandbox import bwrap, suite
from tests.codetasks.sandbox.redteam.attacks import MARKERS


@pytest.fixture(autouse=True)
def nothing_written_outside(tmp_path, monkeypatch):
  bwrap.require()  # the per-process /etc and pycache trees exist before the guard starts
  suite.runtime_binds()
  for m in MARKERS:
    if os.path.exists(m):
      os.unlink(m)
  host_tmp = tmp_path / "grader-tmp"
  host_tmp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(host_tmp))
  yield
  monkeypatch.undo()
  assert [m for m in MARKERS if os.path.exists(m)] == []
  assert sorted(p.name for p in host_tmp.iterdir()) == []  # temp dirs removed, nothing left


# The decoy shape: NORMS is also read by a passing test, so the expected values stay in the
# process and the hidden test is guarded by perturbed copies.
SHARED = "\n\ndef test_norms_table():\n  assert len(NORMS) == 3\n"


@pytest.fixture(scope="session")
def shapes(mini_gen, tmp_path_factory):
  by_name = {t.features[0]["qualname"]: t for t in mini_gen[1]}
  hypot = by_name["hypot_scaled"]
  root = tmp_path_factory.mktemp("decoy-shape")
  names = project.unpack(hypot.hidden_files, root)
  with open(root / "tests/test_core.py", "a") as f:
    f.write(SHARED)
  decoy = dataclasses.replace(
    hypot,
    hidden_files=project.pack(root, names),
    PASS_TO_PASS=[*hypot.PASS_TO_PASS, "tests/test_core.py::test_norms_table"],
  )
  root = tmp_path_factory.mktemp("bare-shape")
  names = project.unpack(hypot.hidden_files, root)
  with open(root / "tests/test_core.py", "a") as f:
    f.write('\n\nNAMES = ["test_hypot"]\n')
  bare = dataclasses.replace(hypot, hidden_files=project.pack(root, names))
  return {
    "greet": by_name["Greeter.greet"],
    "hypot": hypot,
    "decoy": decoy,
    "bare": bare,
    "imported": imported_shape(hypot, tmp_path_factory.mktemp("imported-shape")),
    "imported_greet": imported_class(by_name["Greeter.greet"], tmp_path_factory.mktemp("ig")),
    "inherited_greet": inherited_class(by_name["Greeter.greet"], tmp_path_factory.mktemp("hg")),
    "inherited_local": inherited_class(
      by_name["Greeter.greet"], tmp_path_factory.mktemp("hl"), local=True
    ),
    "same_name": same_name_class(by_name["Greeter.greet"], tmp_path_factory.mktemp("sn")),
  }


def imported_class(greet, root):
  """The greet task with class TestGreeter moved to tests/greet_testdata.py and imported into
  tests/test_core.py, which runs its methods under the same ids."""
  names = project.unpack(greet.hidden_files, root)
  test = root / "tests/test_core.py"
  src = test.read_text()
  cls = src[src.index("class TestGreeter") :]
  (root / "tests/greet_testdata.py").write_text("from minipkg import core\n\n\n" + cls)
  test.write_text(src.replace(cls, "from greet_testdata import TestGreeter  # noqa: E402\n"))
  files = [*names, "tests/greet_testdata.py"]
  return dataclasses.replace(greet, hidden_files=project.pack(root, files))


def inherited_class(greet, root, local=False):
  """The greet task with TestGreeter's methods in class GreeterChecks of tests/greet_base.py,
  subclassed by GreeterMore in tests/greet_mid.py, which tests/test_core.py's TestGreeter
  (now empty) inherits: the same ids run them, defined two files away. `local`: each method
  compares with a local variable bound to its literal (`want = ...; assert x == want`)."""
  names = project.unpack(greet.hidden_files, root)
  test = root / "tests/test_core.py"
  src = test.read_text()
  cls = src[src.index("class TestGreeter") :]
  base = "from minipkg import core\n\n\n" + cls.replace("TestGreeter", "GreeterChecks")
  if local:
    base = re.sub(r"\n( +)assert (.*) == (\".*\")\n", r"\n\1want = \3\n\1assert \2 == want\n", base)
    assert base.count("== want") == 2, base
  (root / "tests/greet_base.py").write_text(base)
  mid = "from greet_base import GreeterChecks\n\n\nclass GreeterMore(GreeterChecks):\n  pass\n"
  (root / "tests/greet_mid.py").write_text(mid)
  sub = (
    "from greet_mid import GreeterMore  # noqa: E402\n\n\nclass TestGreeter(GreeterMore):\n  pass\n"
  )
  test.write_text(src.replace(cls, sub))
  files = [*names, "tests/greet_base.py", "tests/greet_mid.py"]
  return dataclasses.replace(greet, hidden_files=project.pack(root, files))


LOOKALIKE = """

class TestLookalike:
  def test_greet(self):
    assert "hello".upper() == "HELLO"

  def test_farewell(self):
    assert "bye".title() == "Bye"
"""
LOUD = """from test_core import TestGreeter


class TestLoud(TestGreeter):
  def test_farewell(self, who):
    assert who.upper() == "ADA"
""" + LOOKALIKE.replace("Lookalike", "Echo")
SAME_NAME_IDS = [
  "tests/test_core.py::TestLookalike::test_greet",
  "tests/test_core.py::TestLookalike::test_farewell",
  "tests/test_loud.py::TestLoud::test_greet",  # inherited: runs TestGreeter's
  "tests/test_loud.py::TestLoud::test_farewell",  # an override
  "tests/test_loud.py::TestEcho::test_greet",
  "tests/test_loud.py::TestEcho::test_farewell",
]


def same_name_class(greet, root):
  """The greet task with TestGreeter's expected values in locals (nothing can be hidden),
  test classes of the same method names beside it (SAME_NAME_IDS: passing tests)."""
  names = project.unpack(greet.hidden_files, root)
  test = root / "tests/test_core.py"
  src = test.read_text()
  local = re.sub(r"\n( +)assert (.*) == (\".*\")\n", r"\n\1want = \3\n\1assert \2 == want\n", src)
  assert local.count("== want") == 3, local  # test_hypot compared with its want already
  test.write_text(local + LOOKALIKE)
  (root / "tests/test_loud.py").write_text(LOUD)
  return dataclasses.replace(
    greet,
    hidden_files=project.pack(root, [*names, "tests/test_loud.py"]),
    PASS_TO_PASS=[*greet.PASS_TO_PASS, *SAME_NAME_IDS],
  )


def imported_shape(hypot, root):
  """The hypot task with test_hypot (and its table) moved to tests/hypot_testdata.py, a helper
  file pytest does not collect, and imported into tests/test_core.py, which runs it under the
  same ids."""
  names = project.unpack(hypot.hidden_files, root)
  test = root / "tests/test_core.py"
  src = test.read_text()
  table = src[src.index("NORMS = ") : src.index("\n", src.index("NORMS = ")) + 1]
  hypot_def = src[src.index("@pytest.mark.parametrize") : src.index("class TestGreeter")]
  helper = "import pytest\n\nfrom minipkg import core\n\n" + table + "\n\n" + hypot_def
  (root / "tests/hypot_testdata.py").write_text(helper)
  rest = src.replace(table, "").replace(hypot_def, "")
  test.write_text(rest + "\n\nfrom hypot_testdata import test_hypot  # noqa: E402\n")
  files = [*names, "tests/hypot_testdata.py"]
  return dataclasses.replace(hypot, hidden_files=project.pack(root, files))
