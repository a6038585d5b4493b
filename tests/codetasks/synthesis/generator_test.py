"""End-to-end on the mini project: generation, validation, visible workspace, CLIs, bad input."""

import json
import re
import subprocess

import pytest

from composer_jax.codetasks import project
from composer_jax.codetasks import task as task_lib
from composer_jax.codetasks.sandbox import grade_patch, grader, scrub, suite
from composer_jax.codetasks.synthesis import generator, make_tasks, sources
from tests.codetasks.mini_project import FAST, MINI, requires_sandbox, write_project


def test_tasks_are_validated(mini_gen):
  gen, tasks = mini_gen
  assert [t.features[0]["qualname"] for t in tasks] == ["hypot_scaled", "Greeter.greet"]
  for t in tasks:
    assert t.FAIL_TO_PASS and t.PASS_TO_PASS
    assert not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
    assert set(t.FAIL_TO_PASS) | set(t.PASS_TO_PASS) <= set(gen.passing)
    assert t.provenance["verify"] == {
      "gold": 1.0,
      "empty": 0.0,
      "gold_wall_s": t.provenance["verify"]["gold_wall_s"],
    }
    assert t.provenance["coverage_map_sha256"] == gen.map.digest()
  by_name = {t.features[0]["qualname"]: t for t in tasks}
  assert by_name["Greeter.greet"].FAIL_TO_PASS == ["tests/test_core.py::TestGreeter::test_greet"]
  # Coverage map: the parametrized hypot tests exercised hypot_scaled and its helper.
  hyp = [f"tests/test_core.py::test_hypot[{p}]" for p in ("0-0-0.0", "3-4-10.0", "5-12-26.0")]
  assert gen.map.tests_by_symbol["minipkg/core.py::hypot_scaled"] == hyp
  assert gen.map.tests_by_symbol["minipkg/core.py::_scaled"] == hyp


def test_visible_workspace_is_scrubbed(hypot_task, tmp_path):
  files = project.unpack(hypot_task.workspace, tmp_path)
  assert not [f for f in files if "__pycache__" in f or ".mypy_cache" in f or f == "README.md"]
  assert "minipkg/core.py" in files and "tests/test_core.py" in files
  tests_text = (tmp_path / "tests/test_core.py").read_text()
  assert "test_hypot" not in tests_text and "NORMS" not in tests_text
  assert "def test_add()" in tests_text  # PASS_TO_PASS tests stay visible
  log = subprocess.run(
    ["git", "log", "--all", "--format=%H"], cwd=tmp_path, check=True, capture_output=True, text=True
  ).stdout.split()
  assert log == [hypot_task.provenance["git_head"]]
  assert (
    scrub.leak_scan(
      tmp_path, ["hypot_scaled", "_scaled", "_SCALE"], ["  length_of_the_vector = math.hypot(a, b)"]
    )
    == []
  )


def test_problem_statement_has_signature_not_body(hypot_task):
  s = hypot_task.problem_statement
  assert 'def hypot_scaled(a, b):\n  """Twice the Euclidean norm of (a, b)."""\n  ...' in s
  assert "length_of_the_vector" not in s and "return _scaled" not in s
  assert "- tests/test_core.py::test_hypot\n" in s and "3-4-10.0" not in s  # names, not data


def test_grade_cli_gold_and_empty(hypot_task, tmp_path, capsys):
  tasks = tmp_path / "tasks.jsonl"
  task_lib.write_jsonl(tasks, [hypot_task])
  (tmp_path / "gold.diff").write_text(hypot_task.gold_patch)
  assert (
    grade_patch.run(
      ["--tasks", str(tasks), "--id", hypot_task.id, "--patch", str(tmp_path / "gold.diff")]
    )
    == 0
  )
  out = json.loads(capsys.readouterr().out)
  assert out["reward"] == 1.0 and out["partial"] == 1.0 and out["error"] == ""
  assert set(out["tests"]) == set(hypot_task.FAIL_TO_PASS) | set(hypot_task.PASS_TO_PASS)
  assert grade_patch.run(["--tasks", str(tasks), "--id", "nope", "--patch", "GOLD"]) == 1


def test_patch_that_does_not_apply(hypot_task):
  bad = "--- a/minipkg/core.py\n+++ b/minipkg/core.py\n@@ -1,1 +1,1 @@\n-no such line\n+x\n"
  g = grader.grade(hypot_task, bad)
  assert g.reward == 0.0 and g.error.startswith("patch does not apply")


@requires_sandbox
@pytest.mark.parametrize(
  "files,match",
  [
    (
      {
        "pkg/__init__.py": "def f():\n  return 5\n",
        "tests/test_pkg.py": "from pkg import f\n\ndef test_f():\n  assert f() == 2\n",
      },
      r"do not pass before any deletion, e.g. \['tests/test_pkg.py::test_f'\] \("
      r"tests/test_pkg.py::test_f: assert 5 == 2\)",
    ),
    ({"pkg/__init__.py": "def f():\n  return 1\n"}, "has no tests"),
  ],
)
def test_bad_sources_raise_and_write_nothing(tmp_path, files, match, capsys):
  root = write_project(tmp_path / "proj", files)
  gen = generator.Generator(
    sources.resolve(str(root), tmp_path / "w"),
    tmp_path / "w",
    generator.Config(baseline_runs=0, limits=FAST),
  )
  with pytest.raises(ValueError, match=match):
    gen.prepare()
  out = tmp_path / "tasks.jsonl"
  assert make_tasks.run(["--source", str(root), "--out", str(out), "--baseline_runs", "0"]) == 1
  assert not out.exists() and re.search(match, capsys.readouterr().err)


def test_source_resolution_errors(tmp_path):
  with pytest.raises(ValueError, match="not pinned"):
    sources.resolve("inflection==0.0.0", tmp_path)
  with pytest.raises(ValueError, match="not a directory, an sdist file, or name==version"):
    sources.resolve("nonexistent-thing", tmp_path)
  pins = sources.load_manifest()
  assert len(pins) >= 3 and all(len(p["sha256"]) == 64 for p in pins)


def test_unified_diff_roundtrip(tmp_path):
  ws = write_project(tmp_path / "ws", {"a.py": "x = 1\n", "b.py": "y = 2"})
  new = {"a.py": "x = 10\n", "b.py": None, "c/d.py": "z = 3\n"}
  old = {"a.py": "x = 1\n", "b.py": "y = 2", "c/d.py": None}
  assert grader.apply_patch(ws, task_lib.unified_diff(old, new)) == ""
  assert (ws / "a.py").read_text() == "x = 10\n" and not (ws / "b.py").exists()
  assert grader.apply_patch(ws, task_lib.unified_diff(new, old)) == ""
  assert (ws / "b.py").read_text() == "y = 2" and not (ws / "c/d.py").exists()


def test_mini_source_keeps_its_caches(mini_root):
  # The generator never touches its input: the planted caches are still in the source tree.
  assert (mini_root / ".mypy_cache").is_dir() and set(MINI) <= set(
    project.walk(mini_root, skip=frozenset())
  )


def test_harder_variant_deletes_related_features(mini_gen, hypot_task):
  gen, _ = mini_gen
  (harder,) = gen.harder(hypot_task)
  assert [f["qualname"] for f in harder.features] == ["hypot_scaled", "add_numbers"]
  assert set(hypot_task.FAIL_TO_PASS) < set(harder.FAIL_TO_PASS)
  assert harder.provenance["verify"]["gold"] == 1.0 and harder.provenance["n_features"] == 2


VERSIONED = {
  # semantic_version 2.10.0's layout: the package reads its own version from its metadata.
  "vpkg/__init__.py": 'from importlib.metadata import version\n\n__version__ = version("vpkg")\n',
  "vpkg/core.py": "def double(x):\n  return 2 * x\n\n\ndef halve(x):\n  return x // 2\n",
  "vpkg.egg-info/PKG-INFO": "Metadata-Version: 2.1\nName: vpkg\nVersion: 3.1\n\nREADME: double\n",
  "vpkg.egg-info/SOURCES.txt": "vpkg/core.py\n",
  "tests/test_core.py": (
    "from vpkg import core\n\n\ndef test_double():\n  assert core.double(2) == 4\n\n\n"
    "def test_halve():\n  assert core.halve(4) == 2\n"
  ),
}


@requires_sandbox
def test_package_reading_its_own_metadata_makes_tasks(tmp_path):
  """The scrubbed workspace keeps the metadata the package imports, so the gold patch grades
  1.0 there as on the validated tree (it failed every test module's import: pytest exit 4)."""
  src = sources.resolve(str(write_project(tmp_path / "vpkg-3.1", VERSIONED)), tmp_path / "w")
  cfg = generator.Config(max_tasks=1, baseline_runs=0, validation_runs=1, limits=FAST)
  gen = generator.Generator(src, tmp_path / "w", cfg)
  tasks = gen.generate()
  assert len(tasks) == 1 and tasks[0].provenance["verify"]["gold"] == 1.0, gen.log
  project.unpack(tasks[0].workspace, tmp_path / "ws")
  assert (tmp_path / "ws/vpkg.egg-info/PKG-INFO").read_text() == (
    "Metadata-Version: 2.1\nName: vpkg\nVersion: 3.1\n"
  )
  assert not (tmp_path / "ws/vpkg.egg-info/SOURCES.txt").exists()


def test_pytest_error_is_pytests_own_words():
  log = (
    "ERROR: found no collectors for /ws/tests/test_base.py::test_x\n\n"
    "===== ERRORS =====\n"
    "_____ ERROR collecting tests/test_base.py _____\n"
    "ImportError while importing test module '/ws/tests/test_base.py'.\n"
    "E   importlib.metadata.PackageNotFoundError: No package metadata was found for vpkg\n"
    "E   ModuleNotFoundError: No module named 'pkg_resources'\n"
    "_____ ERROR collecting tests/test_spec.py _____\n"
    "E   SyntaxError: other\n"
    "=== short test summary info ===\n"
  )
  assert suite.pytest_error(log) == (
    "ERROR: found no collectors for /ws/tests/test_base.py::test_x | importlib.metadata."
    "PackageNotFoundError: No package metadata was found for vpkg | ModuleNotFoundError: No "
    "module named 'pkg_resources'"
  )


IN_PACKAGE = {
  # toolz 1.0.0's layout: tests inside the package import the functions by name in one
  # parenthesized import; the package star-imports its module; the functions' names are
  # common words that unrelated files also use.
  "tpkg/__init__.py": "from .itertoolz import *  # noqa\n",
  "tpkg/itertoolz.py": (
    "__all__ = ('first', 'second')\n\n\ndef first(seq):\n  return next(iter(seq))\n\n\n"
    "def second(seq):\n  it = iter(seq)\n  next(it)\n  return next(it)\n"
  ),
  "tpkg/compat.py": "# the first and second halves are kept apart\nPY = 3\n",
  "setup.cfg": "[metadata]\nname = tpkg\ndescription = first, second and friends\n",
  "tpkg/tests/test_itertoolz.py": (
    "from tpkg.itertoolz import (first,\n                             second)\n\n\n"
    "def test_first():\n  assert first('ab') == 'a'\n\n\n"
    "def test_second():\n  assert second('ab') == 'b'\n"
  ),
}


@requires_sandbox
def test_in_package_tests_importing_by_name_make_deletions(tmp_path):
  src = sources.resolve(str(write_project(tmp_path / "tpkg-1.0", IN_PACKAGE)), tmp_path / "w")
  cfg = generator.Config(
    max_tasks=1, kinds=("function",), baseline_runs=0, validation_runs=1, limits=FAST
  )
  gen = generator.Generator(src, tmp_path / "w", cfg)
  tasks = gen.generate()
  assert len(tasks) == 1 and tasks[0].provenance["verify"]["gold"] == 1.0, gen.log
  name = tasks[0].features[0]["qualname"]
  assert tasks[0].F2P_direct == [f"tpkg/tests/test_itertoolz.py::test_{name}"]
  project.unpack(tasks[0].workspace, tmp_path / "ws")
  assert name not in (tmp_path / "ws/tpkg/tests/test_itertoolz.py").read_text()
  assert name in (tmp_path / "ws/setup.cfg").read_text()  # a common word, left alone


IMPORTED_TEST = {
  # halve's and triple's tests are defined in a helper file and imported into the test module
  # that runs them. triple's compares with a literal, which the grader hides where the test is
  # defined; halve's expected values are a parametrize table, which cannot be hidden for a test
  # another file runs (instrument/): a task deleting halve is never emitted.
  "ipkg/__init__.py": "",
  "ipkg/core.py": (
    "def double(x):\n  return 2 * x\n\n\ndef halve(x):\n  return x // 2\n\n\n"
    "def triple(x):\n  return 3 * x\n"
  ),
  "setup.cfg": "[metadata]\nname = ipkg\n",
  "tests/test_core.py": (
    "from checks_shared import test_halve, test_triple  # noqa: F401\nfrom ipkg import core\n\n\n"
    "def test_double():\n  assert core.double(2) == 4\n"
  ),
  "tests/checks_shared.py": (
    "import pytest\n\nfrom ipkg import core\n\n\n"
    "@pytest.mark.parametrize('x,want', [(4, 2), (9, 4)])\n"
    "def test_halve(x, want):\n  assert core.halve(x) == want\n\n\n"
    "def test_triple():\n  assert core.triple(2) == 6\n"
  ),
}


@requires_sandbox
def test_tasks_with_unprotected_tests_are_not_emitted(tmp_path):
  src = sources.resolve(str(write_project(tmp_path / "ipkg-1.0", IMPORTED_TEST)), tmp_path / "w")
  cfg = generator.Config(
    max_tasks=3, kinds=("function",), baseline_runs=0, validation_runs=1, limits=FAST
  )
  gen = generator.Generator(src, tmp_path / "w", cfg)
  tasks = gen.generate()
  assert sorted(t.features[0]["qualname"] for t in tasks) == ["double", "triple"], gen.log
  refused = [ln for ln in gen.log if ln.startswith("ipkg/core.py::halve: ")]
  assert len(refused) == 1 and refused[0].startswith(
    "ipkg/core.py::halve: unprotected FAIL_TO_PASS tests (1): tests/test_core.py::test_halve "
    "(defined in tests/checks_shared.py: also run in another file (imported or inherited); "
    "no expected value to hide; not renamed: named other than by a definition at "
    "tests/test_core.py:1)"
  ), gen.log
