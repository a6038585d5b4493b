"""What a grade's rewriting did, as the host keeps it: the hidden expected values (`Site`),
the renames, decoys and id mapping (`Plan`), and the host-side comparison (`matches`)."""

import dataclasses
import operator
import random
import secrets


@dataclasses.dataclass(frozen=True)
class Site:
  """A hidden expected value: `literal` (plain data), compared with == or pytest.approx; for
  a parametrized one (`table`), the value is that of the row whose token the record sends."""

  literal: object
  approx: tuple[tuple[str, object], ...] | None  # approx keyword arguments; None: ==
  where: str  # file:line, for messages
  table: bool = False
  # How the actual value is judged: '==' (with `approx`), 'truthy' / 'falsy' (`assert x`,
  # `assert not x`), 'is' / 'is not' (None, True, False), or an order/membership operator
  # against `literal` ('!=', '<', '<=', '>', '>=', 'in', 'not in'; `flipped`: the literal
  # is on the left).
  op: str = "=="
  flipped: bool = False
  # 'truthy'/'falsy' of `x.<method>(*args)` for a str/bytes predicate (shape.STR_PREDICATES):
  # the record holds x's and the arguments' readings, and the host calls the method itself.
  method: str | None = None


@dataclasses.dataclass
class Plan:
  """What a grade's rewriting did (host side only; the harness gets `harness_config()`)."""

  files: dict[str, bytes]  # rewritten test files: path -> new source
  names: dict[str, str]  # renamed real test function -> original name
  decoys: dict[str, str]  # decoy function -> its twin (the renamed real function)
  sites: dict[int, Site]
  required: dict[str, tuple[int, ...]]  # function (file::chain::name) -> its required sites
  helper: str  # module name the harness registers the site/decoy helpers under
  unprotected: dict[str, str]  # F2P function (file::chain) -> why it was left as it is
  ids: dict[str, str] = dataclasses.field(default_factory=dict)  # test id -> id as renamed
  decoy_ids: list[str] = dataclasses.field(default_factory=list)  # decoy functions' ids
  back: dict[str, str] = dataclasses.field(default_factory=dict)  # renamed table row -> id
  tokens: dict[str, tuple] = dataclasses.field(default_factory=dict)  # token -> (ids, value)
  owner: dict[str, str] = dataclasses.field(default_factory=dict)  # test id -> its function
  # Functions guarded by decoys alone (no required site): function -> its number of decoys.
  decoyed: dict[str, int] = dataclasses.field(default_factory=dict)
  # The run order's key: drawn host-side for each grade, never sent into the sandbox.
  order_key: int = dataclasses.field(default_factory=lambda: secrets.randbits(64))

  def harness_config(self) -> dict:
    """All the harness learns of the plan: the helper module's name. Which items are decoys
    (and which real) never enters the sandbox: the run order is the host's (`run_order`)."""
    return {"helper": self.helper}

  def run_ids(self, ids: list[str]) -> list[str]:
    """The node ids to run for test ids `ids`: renamed ones under their new names, and the
    decoys."""
    return [self.ids.get(i, i) for i in ids] + self.decoy_ids

  def run_order(self, ids: list[str]) -> list[str]:
    """`run_ids(ids)` in the order pytest collects and runs them (it follows its arguments):
    a permutation drawn from `order_key`, so a real test's place among its decoys and the
    sentinels is nothing the candidate's process can know."""
    out = self.run_ids(ids)
    random.Random(self.order_key).shuffle(out)
    return out

  def split(self, nodeid: str) -> tuple[str, str, str]:
    """('real'|'decoy'|'other', id with original names, function name as collected)."""
    head, func, params = split_id(nodeid)
    if nodeid in self.back:
      return "real", self.back[nodeid], func
    if func in self.names:
      return "real", head + self.names[func] + params, func
    if func in self.decoys:
      return "decoy", nodeid, func
    return "other", nodeid, func


def split_id(nodeid: str) -> tuple[str, str, str]:
  """'f.py::C::test_x[a::b]' -> ('f.py::C::', 'test_x', '[a::b]')."""
  file, sep, rest = nodeid.partition("::")
  bracket = rest.find("[")
  names, params = (rest, "") if bracket < 0 else (rest[:bracket], rest[bracket:])
  chain, _, func = names.rpartition("::")
  return file + sep + (chain + "::" if chain else ""), func, params


def matches(site: Site, expected, value, decode, truth=None, args=None) -> bool:
  """Whether `value` (the canonical encoding of the actual value, decoded by `decode`; None:
  it had none) equals `expected`: == on plain data, or pytest.approx with the site's
  arguments, or `site.op`. Both sides are plain data here, so the comparison is Python's
  own. `truth`: True when a value without a reading is true by default (no __bool__ or
  __len__ anywhere in its type: site_values). `args`: the readings of a str predicate's
  arguments (`site.method`)."""
  if value is None:  # no canonical reading: it is not None, and maybe true by default
    if site.method is not None:  # a predicate of a receiver that is no str or bytes
      return False
    return (site.op == "is not" and expected is None) or (site.op == "truthy" and truth is True)
  try:
    actual = decode(value)
  except (ValueError, TypeError, ArithmeticError, RecursionError):
    return False
  if site.method is not None:
    actual = _call(site.method, actual, args, decode)
    if actual is None:
      return False
  if site.op != "==":
    return _holds(site, actual, expected)
  if site.approx is None:
    return _same(actual, expected)
  import pytest

  try:
    return bool(pytest.approx(expected, **dict(site.approx)) == actual)
  except (TypeError, ValueError):
    return False


_OPS = {
  "truthy": lambda a, _: bool(a),
  "falsy": lambda a, _: not a,
  "is": operator.is_,
  "is not": operator.is_not,
  "!=": operator.ne,
  "<": operator.lt,
  "<=": operator.le,
  ">": operator.gt,
  ">=": operator.ge,
  "in": lambda a, b: a in b,
  "not in": lambda a, b: a not in b,
}


def _call(method: str, receiver, args, decode):
  """`str.<method>(receiver, *args)` (or bytes') on plain data, None if not that."""
  if type(receiver) not in (str, bytes) or not isinstance(args, list) or len(args) > 3:
    return None
  try:
    values = [decode(a) for a in args]
    return bool(getattr(type(receiver), method)(receiver, *values))
  except (ValueError, TypeError, AttributeError, RecursionError):
    return None


def _holds(site: Site, actual, expected) -> bool:
  """`actual <op> expected` on plain data (the literal on the left where `flipped`)."""
  fn = _OPS.get(site.op)
  if fn is None:
    return False
  a, b = (expected, actual) if site.flipped else (actual, expected)
  try:
    return bool(fn(a, b))
  except (TypeError, ValueError, ArithmeticError, RecursionError):
    return False


def _same(actual, expected) -> bool:
  try:
    return bool(actual == expected)
  except (TypeError, ValueError, ArithmeticError, RecursionError):
    return False
