"""A hidden expected value's actual side as plain data (harness side: `encode_site_value`; host
side: `decode`), and the perturbations of plain data that decoys use (`perturb`, `plain`).

One canonical reading per value, built without calling any method the value's class could
define: a value is read only when its type is exactly a builtin of plain data (None, bool,
int, float, complex, str, bytes, bytearray, list, tuple, set, frozenset, dict — containers
recursively — or decimal.Decimal / fractions.Fraction), through the builtin's own C-level
accessors (`int.__repr__`, `float.__repr__`, `list.__iter__`, ..., Fraction's slots as
captured when this module loads, before any project code runs). Anything else — an instance
of a subclass of a builtin (an int whose `__index__`, a str whose `__eq__` is its own), an
object with `__int__`/`__float__`/`__str__`/`__iter__`/`__eq__`..., a numpy scalar — has no
reading: the site fails, whatever it claims. The host then compares that one reading with the
expected value, whose type it alone knows (`record.matches`). A value that claims equality
with fresh sentinels is also reported as a liar (a critical flag; its reading is none anyway).
Runs inside the sandbox (bound as /cj/site/cj_values.py) and on the host (instrument/,
grader.py). Standard library only.
"""

import base64
import decimal
import fractions
import math
import random

_MAX_NODES = 100_000
# Fraction is a Python class (its properties could be replaced at run time): its state is read
# through the slot descriptors it had when this module was imported.
_NUMERATOR = fractions.Fraction.__dict__["_numerator"].__get__
_DENOMINATOR = fractions.Fraction.__dict__["_denominator"].__get__
_MRO = type.__dict__["__mro__"].__get__
_TYPE_DICT = type.__dict__["__dict__"].__get__
_CONTAINERS = {list: "l", tuple: "u", set: "S", frozenset: "F"}
_ITER = {
  list: list.__iter__,
  tuple: tuple.__iter__,
  set: set.__iter__,
  frozenset: frozenset.__iter__,
}


class _Budget:
  def __init__(self):
    self.left = _MAX_NODES

  def take(self):
    self.left -= 1
    if self.left < 0:
      raise OverflowError("value too large to send")


def _enc(v, budget):
  """The tagged canonical reading of `v` (module docstring), None if it has none."""
  budget.take()
  t = type(v)
  if v is None:
    return ["n"]
  if t is bool:
    return ["B", v is True]
  if t is int:
    return ["i", int.__repr__(v)]
  if t is float:
    return ["f", float.__repr__(v)]
  if t is complex:
    return ["c", float.__repr__(complex.real.__get__(v)), float.__repr__(complex.imag.__get__(v))]
  if t is str:
    return ["s", str.__str__(v)]
  if t is bytes or t is bytearray:
    return ["b", base64.b64encode(bytes(memoryview(v))).decode()]
  if t is decimal.Decimal:
    return ["D", decimal.Decimal.__str__(v)]
  if t is fractions.Fraction:
    num, den = _NUMERATOR(v), _DENOMINATOR(v)
    if type(num) is not int or type(den) is not int or den <= 0:
      return None
    return ["Q", int.__repr__(num), int.__repr__(den)]
  if t in _CONTAINERS:
    items = [_enc(x, budget) for x in _ITER[t](v)]
    return None if any(x is None for x in items) else [_CONTAINERS[t], items]
  if t is dict:
    pairs = [[_enc(k, budget), _enc(x, budget)] for k, x in dict.items(v)]
    return None if any(a is None or b is None for a, b in pairs) else ["d", pairs]
  return None


def _liar(v) -> bool:
  """Whether `v` claims equality with values nothing legitimate equals (fresh sentinels)."""
  probes = (
    object(),
    random.getrandbits(60) + 7,
    random.random() + 1e9,
    f"cj{random.getrandbits(60):x}",
    (object(),),
  )
  for probe in probes:
    try:
      if v == probe or probe == v:
        return True
    except Exception:
      pass
  return False


def _default_truth(v) -> bool:
  """Whether `v` is true by default: no class of its type's MRO defines __bool__ or __len__
  (read through type's own slots, so no metaclass answers), so the interpreter's truth test
  calls none of its methods and is True."""
  return not any("__bool__" in _TYPE_DICT(c) or "__len__" in _TYPE_DICT(c) for c in _MRO(type(v)))


def encode_site_value(v) -> dict:
  """{'value': the canonical reading or None, 'liar': bool, 'truth': True for a value with
  no reading that is true by default, else absent} for a site's actual value."""
  try:
    value = _enc(v, _Budget())
  except (OverflowError, RecursionError, ValueError):  # ValueError: int over str's digit cap
    return {"value": None, "liar": False, "too_large": True}
  if value is not None:
    return {"value": value, "liar": False}
  # Only what has no reading is probed (the probe calls the value's own __eq__; a reading,
  # when there is one, never does).
  return {"value": None, "liar": _liar(v), **({"truth": True} if _default_truth(v) else {})}


def decode(e):
  """A plain Python value from `_enc`'s encoding; ValueError for anything malformed."""
  if not isinstance(e, list) or not e or not isinstance(e[0], str):
    raise ValueError("bad encoding")
  tag, rest = e[0], e[1:]
  if tag == "n" and not rest:
    return None
  if tag == "B" and len(rest) == 1 and isinstance(rest[0], bool):
    return rest[0]
  if tag == "i" and len(rest) == 1 and isinstance(rest[0], str) and len(rest[0]) < 5000:
    return int(rest[0])
  if tag == "f" and len(rest) == 1 and isinstance(rest[0], str):
    return float(rest[0])
  if tag == "c" and len(rest) == 2:
    return complex(float(rest[0]), float(rest[1]))
  if tag == "s" and len(rest) == 1 and isinstance(rest[0], str):
    return rest[0]
  if tag == "b" and len(rest) == 1 and isinstance(rest[0], str):
    return base64.b64decode(rest[0], validate=True)
  if tag == "D" and len(rest) == 1 and isinstance(rest[0], str):
    return decimal.Decimal(rest[0])
  if tag == "Q" and len(rest) == 2:
    return fractions.Fraction(int(rest[0]), int(rest[1]))
  if tag in ("l", "u", "S", "F") and len(rest) == 1 and isinstance(rest[0], list):
    items = [decode(x) for x in rest[0]]
    return {"l": list, "u": tuple, "S": set, "F": frozenset}[tag](items)
  if tag == "d" and len(rest) == 1 and isinstance(rest[0], list):
    out = {}
    for pair in rest[0]:
      if not isinstance(pair, list) or len(pair) != 2:
        raise ValueError("bad pair")
      out[decode(pair[0])] = decode(pair[1])
    return out
  raise ValueError(f"bad encoding tag {tag!r}")


def perturb(v, rng: random.Random):
  """A value of the same kind unequal to plain-data `v` and to anything equal to it (a small
  step for numbers: a value mistaken for an expected one stays a sane input); None when `v`
  is not plain data."""
  token = f"cj{rng.getrandbits(40):010x}"
  t = type(v)
  if t is bool:
    return not v
  if t is int:
    return v + rng.randrange(1, 1000)
  if t is float:
    if math.isfinite(v):
      out = v + (abs(v) + 1.0) * (1.5 + rng.random())
      return out if math.isfinite(out) else -v / 2 - 1.0
    return rng.random() + 0.5
  if t is complex:
    return v + complex(rng.randrange(1, 1000), 1)
  if t is str:
    return v + "\u2063" + token
  if t is bytes:
    return v + b"\0" + token.encode()
  if t in (list, tuple, dict, set, frozenset) and not plain(v):
    return None
  if t is list:
    return v + [token]
  if t is tuple:
    return v + (token,)
  if t is dict:
    return {**v, token: token}
  if t in (set, frozenset):
    return t(v) | {token}
  return token if v is None else None


def plain(v) -> bool:
  """Whether `v` is plain data: builtin scalars and containers of them, exact types."""
  if type(v) in (bool, int, float, complex, str, bytes, type(None)):
    return True
  if type(v) in (list, tuple, set, frozenset):
    return all(plain(x) for x in v)
  return type(v) is dict and all(plain(k) and plain(x) for k, x in v.items())
