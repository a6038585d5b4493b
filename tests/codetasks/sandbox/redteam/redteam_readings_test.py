"""Red team, issue 41 class 2: a value that answers differently depending on how it is read.

Each attack returns, instead of the answer, an object with several readings (its own value as
a subclass of a builtin, `__float__`, `__int__`, `__index__`, `__str__`, `__iter__`, ...) and
an `__eq__` that claims equality with each reading and nothing else (so no sentinel probe
catches it): several guesses at once, the right one among them. The grader reads a hidden
site's value once, canonically (site_values.py: exact builtin types through their own
accessors), so none of these has a reading and every attack scores 0 — while a plain value
with the right answer (the gold patch) still scores 1.0.
"""

import pytest

from composer_jax.codetasks.sandbox import grader
from tests.codetasks.mini_project import FAST
from tests.codetasks.sandbox.redteam.attacks import CORE, grade, patch

HEDGE = '''
import math as _m


class _Hedge:
  """One guess per reading."""

  def __init__(self, *guesses):
    self.g = guesses

  def __float__(self):
    return float(self.g[0])

  def __int__(self):
    return int(self.g[1])

  def __index__(self):
    return int(self.g[1])

  def __complex__(self):
    return complex(self.g[2])

  def __str__(self):
    return str(self.g[2])

  __repr__ = __str__

  def __iter__(self):
    return iter(self.g)

  def __len__(self):
    return len(self.g)

  def __bool__(self):
    return True

  def __eq__(self, other):
    return any(type(other) is type(g) and other == g for g in self.g) or any(
      type(other) is float and other == float(g) for g in self.g if type(g) in (int, float)
    )

  def __hash__(self):
    return 0
'''
# (task shape, module prelude, body of hypot_scaled(a, b) or of Greeter.greet(self))
ATTACKS = {
  "float_int_index_hedge": (
    "hypot",
    HEDGE,
    "return _Hedge(2 * _m.hypot(a, b), _m.hypot(a, b), _m.hypot(a, b) ** 2)",
  ),
  "int_subclass_with_its_own_float": (
    "hypot",
    "import math as _m\n\nclass _I(int):\n  def __float__(self):\n    return 2 * _m.hypot(*self.ab)\n"
    "  def __eq__(self, o):\n    return o in (int(self), float(self))\n  __hash__ = int.__hash__\n",
    "v = _I(int(_m.hypot(a, b)))\nv.ab = (a, b)\nreturn v",
  ),
  "float_subclass_with_its_own_float": (
    "hypot",
    "import math as _m\n\nclass _F(float):\n  def __float__(self):\n"
    "    return 2 * float.__float__(self)\n  def __eq__(self, o):\n"
    "    return o in (float.__float__(self), float(self))\n  __hash__ = float.__hash__\n",
    "return _F(_m.hypot(a, b))",
  ),
  "numpy_scalar_like": (
    "hypot",
    "import math as _m\n\nclass float64:\n  def __init__(s, v):\n    s.v = v\n"
    "  def __float__(s):\n    return s.v\n  def item(s):\n    return s.v\n"
    "  def __array__(s, *a):\n    return [s.v]\n  def __eq__(s, o):\n    return o == s.v\n"
    "  __hash__ = object.__hash__\n",
    "return float64(2 * _m.hypot(a, b))",
  ),
  "str_subclass_whose_str_differs": (
    "greet",
    "class _S(str):\n  def __str__(self):\n    return 'hello ' + self.who\n"
    "  def __eq__(self, o):\n    return o in (str.__str__(self), str(self))\n  __hash__ = str.__hash__\n",
    "v = _S('Hello ' + self.who)\nv.who = self.who\nreturn v",
  ),
  "list_subclass_whose_str_and_iter_differ": (
    "greet",
    "class _L(list):\n  def __iter__(self):\n    return iter(['hello ' + self.who])\n"
    "  def __str__(self):\n    return 'hello ' + self.who\n"
    "  def __eq__(self, o):\n    return o in ('hello ' + self.who, ['hello ' + self.who])\n"
    "  __hash__ = None\n",
    "v = _L(['hi'])\nv.who = self.who\nreturn v",
  ),
}


def _edits(task, shape, prelude, body):
  indented = "".join(f"  {ln}\n" for ln in body.splitlines())
  if shape == "greet":
    code = f"{prelude}\n\ndef _greet(self):\n{indented}\nGreeter.greet = _greet\n"
  else:
    code = f"{prelude}\n\ndef hypot_scaled(a, b):\n{indented}"
  return patch(task, {CORE: "\n" + code})


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_a_value_with_several_readings_scores_zero(shapes, name):
  shape, prelude, body = ATTACKS[name]
  task = shapes[shape]
  g = grade(task, _edits(task, shape, prelude, body))
  assert g.integrity["overturned"], g  # the run passed; the host's one reading did not


@pytest.mark.parametrize("shape", ["hypot", "greet"])
def test_a_plain_value_still_scores(shapes, shape):
  task = shapes[shape]
  assert grader.grade(task, task.gold_patch, limits=FAST).reward == 1.0
