"""The synthetic mini project shared by the coding-env tests (built in tmp dirs)."""

import textwrap
from pathlib import Path

import pytest

from composer_jax.codetasks.sandbox import bwrap

MINI = {
  "minipkg/__init__.py": """\
        from .core import Greeter, add_numbers, hypot_scaled
        from .text import shout

        __all__ = ["Greeter", "add_numbers", "hypot_scaled", "shout"]
        """,
  "minipkg/core.py": """\
        import math

        _SCALE = 2  # used only by the helper below


        def _scaled(x):
          return x * _SCALE


        def add_numbers(a, b):
          \"\"\"Returns a + b.\"\"\"
          return a + b


        def hypot_scaled(a, b):
          \"\"\"Twice the Euclidean norm of (a, b).\"\"\"
          length_of_the_vector = math.hypot(a, b)
          return _scaled(length_of_the_vector)


        class Greeter:
          \"\"\"Greets someone.\"\"\"

          def __init__(self, who):
            self.who = who

          def greet(self):
            return "hello " + self.who

          def farewell_message(self):
            \"\"\"Says goodbye.\"\"\"
            return "goodbye, dear " + self.who.upper()
        """,
  "minipkg/text.py": """\
        def shout(text):
          \"\"\"Upper-cases text and adds an exclamation mark.\"\"\"
          return text.upper() + "!"
        """,
  "tests/conftest.py": """\
        import pytest


        @pytest.fixture
        def who():
          return "ada"
        """,
  "tests/test_core.py": """\
        import pytest

        from minipkg import core

        NORMS = [(3, 4, 10.0), (0, 0, 0.0), (5, 12, 26.0)]


        def test_add():
          assert core.add_numbers(1, 2) == 3


        def test_add_negative():
          assert core.add_numbers(-1, -2) == -3


        @pytest.mark.parametrize("a,b,want", NORMS)
        def test_hypot(a, b, want):
          assert core.hypot_scaled(a, b) == want


        class TestGreeter:
          def test_greet(self, who):
            assert core.Greeter(who).greet() == "hello ada"

          def test_farewell(self, who):
            assert core.Greeter(who).farewell_message() == "goodbye, dear ADA"
        """,
  "tests/test_text.py": """\
        from minipkg import text


        def test_shout():
          assert text.shout("hi") == "HI!"
        """,
  "setup.cfg": """\
        [tool:pytest]
        testpaths = tests
        """,
  "README.md": "minipkg: hypot_scaled, farewell_message and friends.\n",
  # Left over from an "earlier run" of the original: must never reach the visible workspace.
  ".mypy_cache/3.11/minipkg/core.data.json": '{"hypot_scaled": "def (a, b)"}\n',
  "minipkg/__pycache__/core.cpython-311.pyc": "length_of_the_vector = math.hypot(a, b)\n",
}

FAST = bwrap.Limits(cpu_s=20, wall_s=60.0)
requires_sandbox = pytest.mark.skipif(bool(bwrap.available()), reason=bwrap.available())


def write_project(root: Path, files: dict[str, str]) -> Path:
  for rel, text in files.items():
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(textwrap.dedent(text))
  return root
