"""libcst deletion, test hiding, scrubbing and the leak scan on the synthetic mini project."""

import builtins
import subprocess
import sys
import types

import pytest

from composer_jax.codetasks import project
from composer_jax.codetasks.sandbox import scrub
from composer_jax.codetasks.synthesis import deletion, hiding, testmap
from tests.codetasks.mini_project import MINI, write_project


@pytest.fixture
def mini(tmp_path):
  root = write_project(tmp_path / "mini", MINI)
  proj = deletion.Project(root)
  syms = {s.qualname: s for f in proj.files for s in testmap.symbols_in_file(root, f)}
  return root, proj, syms


def test_eligibility(mini):
  _, proj, syms = mini
  got = sorted(k for k, s in syms.items() if proj.eligible(s))
  # _scaled is private; minipkg.core is used by __init__; minipkg.text is imported by name.
  assert got == [
    "Greeter",
    "Greeter.farewell_message",
    "Greeter.greet",
    "add_numbers",
    "hypot_scaled",
    "shout",
  ]


def test_delete_function_removes_dead_helpers_and_imports(mini):
  root, proj, syms = mini
  d = proj.delete([syms["hypot_scaled"]])
  core = d.changed["minipkg/core.py"]
  assert core.startswith("def add_numbers(a, b):")  # `import math` + `_SCALE` + `_scaled` gone
  for gone in ("hypot_scaled", "_scaled", "_SCALE", "import math"):
    assert gone not in core
  assert "  return a + b\n" in core and "class Greeter:" in core  # the rest untouched
  assert d.changed["minipkg/__init__.py"] == (
    "from .core import Greeter, add_numbers\nfrom .text import shout\n\n"
    '__all__ = ["Greeter", "add_numbers", "shout"]\n'
  )
  assert d.removed_names == ["_SCALE", "_scaled", "hypot_scaled"]
  assert d.stubs == [
    "# function hypot_scaled in minipkg/core.py\ndef hypot_scaled(a, b):\n"
    '  """Twice the Euclidean norm of (a, b)."""\n  ...'
  ]


def test_delete_reexported_function_and_method(mini):
  _, proj, syms = mini
  d = proj.delete([syms["shout"], syms["Greeter.farewell_message"]])
  assert d.changed["minipkg/text.py"] == "\n"
  assert d.changed["minipkg/__init__.py"] == (
    "from .core import Greeter, add_numbers, hypot_scaled\n\n"
    '__all__ = ["Greeter", "add_numbers", "hypot_scaled"]\n'
  )
  core = d.changed["minipkg/core.py"]
  assert "def greet(self):" in core and "farewell_message" not in core
  assert core.endswith('    return "hello " + self.who\n')


def test_delete_is_deterministic(mini):
  _, proj, syms = mini
  a = proj.delete([syms["Greeter"]])
  b = deletion.Project(proj.root).delete([syms["Greeter"]])
  assert a.changed == b.changed and a.removed_code == b.removed_code


def test_hide_tests_removes_functions_and_their_data(mini):
  root, _, _ = mini
  passing = [
    "tests/test_core.py::test_add",
    "tests/test_core.py::test_hypot[3-4-10.0]",
    "tests/test_core.py::TestGreeter::test_greet",
    "tests/test_text.py::test_shout",
    "tests/test_core.py::TestGreeter::test_farewell",
  ]
  touched = hiding.hide_tests(root, [passing[1], passing[2], passing[3]], passing)
  assert touched == ["tests/test_core.py", "tests/test_text.py"]
  text = (root / "tests/test_core.py").read_text()
  assert "def test_add():" in text and "test_hypot" not in text and "NORMS" not in text
  assert "def test_greet" not in text and "def test_farewell" in text
  assert not (root / "tests/test_text.py").exists()  # all of its tests were hidden
  hiding.hide_tests(
    root,
    ["tests/test_core.py::TestGreeter::test_farewell"],
    ["tests/test_core.py::test_add", "tests/test_core.py::TestGreeter::test_farewell"],
  )
  assert "TestGreeter" not in (root / "tests/test_core.py").read_text()  # emptied class goes


def test_scrub_git_and_leak_scan(tmp_path):
  ws = write_project(tmp_path / "ws", MINI)
  removed = scrub.scrub(ws)
  assert set(removed) == {".mypy_cache", "README.md", "minipkg/__pycache__"}
  head = scrub.fresh_git(ws)
  ws2 = write_project(tmp_path / "ws2", MINI)
  scrub.scrub(ws2)
  assert scrub.fresh_git(ws2) == head  # deterministic single commit
  log = subprocess.run(
    ["git", "log", "--all", "--format=%H"], cwd=ws, capture_output=True, text=True, check=True
  ).stdout.split()
  assert log == [head]
  # Names are matched as identifiers, in plain files and inside compressed git objects.
  hits = scrub.leak_scan(ws, ["farewell_message", "Greet"], [])
  assert "minipkg/core.py: name 'farewell_message'" in hits
  assert any(h.startswith(".git/objects/") for h in hits)
  assert not any("'Greet'" in h for h in hits)  # `Greeter`/`greet` are other identifiers
  line = '    return "goodbye, dear " + self.who.upper()'
  assert scrub.leak_lines([line]) == [line.strip()]
  assert scrub.leak_lines([line], revealed=line) == []


def test_pack_roundtrip_is_deterministic(tmp_path):
  ws = write_project(tmp_path / "ws", {"a.py": "x = 1\n", "d/b.txt": "b\n"})
  blob = project.pack(ws, ["d/b.txt", "a.py"])
  assert blob == project.pack(ws, ["a.py", "d/b.txt"])
  assert sorted(project.unpack(blob, tmp_path / "out")) == ["a.py", "d/b.txt"]
  assert (tmp_path / "out/d/b.txt").read_text() == "b\n"


def test_guard_test_imports_by_hand(tmp_path):
  """A test module's top-level import of a deleted name falls back to None (the module stays
  importable); other imports, conftest.py and untouched modules are left as they are."""
  before = (
    '"""Doc."""\nimport os\nfrom pkg.core import keep, gone as g, other  # noqa\n'
    "from pkg import (\n    gone2,\n)\n\n\ndef test_x():\n    assert g() == 1\n"
  )
  write_project(
    tmp_path,
    {
      "pkg/__init__.py": "",
      "tests/test_a.py": before,
      "tests/test_b.py": "from pkg.core import keep\n",
      "tests/conftest.py": "from pkg.core import gone\n",
    },
  )
  out = deletion.guard_test_imports(tmp_path, {"gone", "gone2"})
  assert out == {
    "tests/test_a.py": (
      '"""Doc."""\nimport os\nfrom pkg.core import keep, other  # noqa\n'
      "try:\n    from pkg.core import gone as g\nexcept ImportError:\n    g = None\n"
      "try:\n    from pkg import (\n    gone2)\nexcept ImportError:\n    gone2 = None\n"
      "\n\ndef test_x():\n    assert g() == 1\n"
    )
  }
  # Importable without the names; the same bindings while they exist.
  for has in (False, True):
    pkg = types.SimpleNamespace(keep=1, other=2, **({"gone": 3, "gone2": 4} if has else {}))
    ns = {"__builtins__": {**vars(builtins), "__import__": lambda *a, pkg=pkg, **k: pkg}}
    exec(out["tests/test_a.py"], ns)
    assert (ns["g"], ns["gone2"], ns["keep"]) == ((3, 4, 1) if has else (None, None, 1))


def test_unused_import_guards_leave_the_visible_tests(tmp_path):
  """Once the tests using a guarded name are hidden, its guard goes (it names the deleted
  feature); a guard still used, and a project's own try/except import, stay."""
  text = (
    "try:\n    from pkg.core import gone\nexcept ImportError:\n    gone = None\n"
    "try:\n    from pkg.core import used as u\nexcept ImportError:\n    u = None\n"
    "try:\n    from pkg.core import opt\nexcept ImportError:\n    opt = False\n"
    "\n\ndef test_u():\n    assert u is None or u()\n"
  )
  write_project(tmp_path, {"tests/test_a.py": text, "tests/test_b.py": "x = 1\n"})
  assert hiding.drop_unused_guards(tmp_path, ["tests/test_a.py", "tests/test_b.py"]) == [
    "tests/test_a.py"
  ]
  assert (tmp_path / "tests/test_a.py").read_text() == text[
    text.index("try:\n    from pkg.core import used") :
  ]


def test_leak_scan_counts_what_the_task_does_not_show(tmp_path):
  """toolz's false hits: a deleted `call` or `raises` is a common word in unrelated files, and a
  deleted module's import line is part of a longer kept line. A removed private helper's name
  counts anywhere, and in a binary file (compiled code) every name counts."""
  removed = [
    "def call(self, *args):\n    return self._apply_twice(args)\n",
    "from itertools import filterfalse\n",
  ]
  write_project(
    tmp_path,
    {
      "versioneer.py": "subprocess.call(cmd)  # unrelated\n",
      "pkg/core.py": "from itertools import filterfalse, zip_longest\n",
      "pkg/data.txt": "see _apply_twice\n",
    },
  )
  (tmp_path / "pkg/blob.bin").write_bytes(b"\x00\xffcall\x00")
  shown = "def call(self, *args):\n    ...\nfrom itertools import filterfalse, zip_longest\n"
  hits = scrub.leak_scan(tmp_path, ["call", "_apply_twice"], removed, shown)
  assert sorted(hits) == ["pkg/blob.bin: name 'call'", "pkg/data.txt: name '_apply_twice'"]
  # The same files with nothing shown: every occurrence is a hit.
  assert sorted(scrub.leak_scan(tmp_path, ["call", "_apply_twice"], removed)) == [
    "pkg/blob.bin: name 'call'",
    "pkg/core.py: line 'from itertools import filterfalse'",
    "pkg/data.txt: name '_apply_twice'",
    "versioneer.py: name 'call'",
  ]


def test_scrub_keeps_the_metadata_a_package_imports(tmp_path):
  """semantic_version reads its version with importlib.metadata: an importable root's egg-info
  stays, cut to what imports read; prose at the root goes whatever its case."""
  pkg_info = "Metadata-Version: 2.1\nName: vpkg\nVersion: 1.2\nSummary: s\nDescription: the API\n"
  write_project(
    tmp_path,
    {
      "vpkg.egg-info/PKG-INFO": pkg_info + "\nlong README text\n",
      "vpkg.egg-info/SOURCES.txt": "vpkg/secret.py\n",
      "vpkg.egg-info/entry_points.txt": "[console_scripts]\nv = vpkg:main\n",
      "src/other.egg-info/PKG-INFO": "Name: other\nVersion: 2\n",
      "vpkg/nested.egg-info/PKG-INFO": "Name: x\n",
      "ChangeLog": "2.10: added secret\n",
      "vpkg/__init__.py": "",
      "vpkg/history.py": "",
    },
  )
  removed = scrub.scrub(tmp_path)
  assert sorted(removed) == ["ChangeLog", "vpkg.egg-info/SOURCES.txt", "vpkg/nested.egg-info"]
  assert (tmp_path / "vpkg.egg-info/PKG-INFO").read_text() == (
    "Metadata-Version: 2.1\nName: vpkg\nVersion: 1.2\n"
  )
  assert (tmp_path / "vpkg.egg-info/entry_points.txt").exists()
  assert (tmp_path / "src/other.egg-info/PKG-INFO").exists()
  res = subprocess.run(
    [
      sys.executable,
      "-I",
      "-c",
      "import sys; sys.path.insert(0, '.'); from importlib.metadata import version; "
      "print(version('vpkg'))",
    ],
    cwd=tmp_path,
    capture_output=True,
    text=True,
  )
  assert res.stdout == "1.2\n", res.stderr
