"""A hidden expected value's actual side as plain data (harness side: `encode_site_value`; host
side: `decode`), and the perturbations of plain data that decoys use (`perturb`, `plain`).

Builtins are read through their C slots and other objects through the conversions they
themselves claim equality with, so what reaches the host is data, never an object whose
equality could lie; a value that claims equality with fresh sentinels is reported as a liar.
Runs inside the sandbox (bound as /cj/site/cj_values.py) and on the host (instrument/,
grader.py). Standard library only.
"""

import base64
import decimal
import fractions
import math
import random

_MAX_NODES = 100_000


class _Budget:
  def __init__(self):
    self.left = _MAX_NODES

  def take(self):
    self.left -= 1
    if self.left < 0:
      raise OverflowError("value too large to send")


def _enc(v, budget, conv=True):
  """Tagged plain encoding of `v` (builtins read through their C slots), None if opaque."""
  budget.take()
  if v is None:
    return ["n"]
  if v is True or v is False:
    return ["B", v]
  if isinstance(v, int):
    return ["i", str(int.__index__(v))]
  if isinstance(v, float):
    return ["f", float.__repr__(float.__float__(v))]
  if isinstance(v, complex):
    c = complex.__complex__(v)
    return ["c", float.__repr__(c.real), float.__repr__(c.imag)]
  if isinstance(v, str):
    return ["s", str.__str__(v)]
  if isinstance(v, (bytes, bytearray)):
    return ["b", base64.b64encode(bytes(memoryview(v))).decode()]
  if isinstance(v, decimal.Decimal):
    return ["D", str(decimal.Decimal.__str__(v))]
  if isinstance(v, fractions.Fraction):
    return ["Q", str(int(v.numerator)), str(int(v.denominator))]
  for base, tag, it in (
    (list, "l", list.__iter__),
    (tuple, "u", tuple.__iter__),
    (set, "S", set.__iter__),
    (frozenset, "F", frozenset.__iter__),
  ):
    if isinstance(v, base):
      items = [_enc(x, budget) for x in it(v)]
      return None if any(x is None for x in items) else [tag, items]
  if isinstance(v, dict):
    pairs = [[_enc(k, budget), _enc(x, budget)] for k, x in dict.items(v)]
    return None if any(a is None or b is None for a, b in pairs) else ["d", pairs]
  if conv:
    views = _views(v, budget)
    return views[0] if views else None
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


def _views(v, budget) -> list:
  """Encodings of `v`'s conversions (list, tuple, dict, str, int, float, bytes) that `v` itself
  says it equals; `v` must not be a liar."""
  out = []
  for conv in (list, tuple, dict, str, int, float, bytes):
    try:
      w = conv(v)
      if type(w) is not conv or not bool(v == w):
        continue
      e = _enc(w, budget, conv=False)
    except (Exception, RecursionError):
      continue
    if e is not None:
      out.append(e)
  return out


def encode_site_value(v) -> dict:
  """{'views': [encodings], 'liar': bool} for a site's actual value."""
  budget = _Budget()
  exact = type(v) in (type(None), bool, int, float, complex, str, bytes)
  try:
    liar = not exact and _liar(v)
    views = []
    if not liar:
      first = _enc(v, budget, conv=False)
      for e in ([first] if first is not None else []) + _views(v, budget):
        if e not in views:
          views.append(e)
  except (OverflowError, RecursionError):
    return {"views": [], "liar": False, "too_large": True}
  return {"views": views, "liar": liar}


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
