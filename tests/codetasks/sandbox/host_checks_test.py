"""The host-side checks of #41 (instrument/, site_values.py), without a sandbox: truth,
identity and order checks and literal-bound locals as hidden sites, str predicates called on
the host, and a run order that is the host's alone."""

import random
import re

from composer_jax.codetasks.sandbox import instrument, site_values
from tests.codetasks.sandbox.instrument_test import F2P, IDS, SRC, Hedge, _sentinels, _subclass


def _plan(rel: str, src: bytes, f2p: list[str]) -> instrument.Plan:
  return instrument.plan({rel: src}, f2p, f2p, rng=random.Random(0))


def _judge(site, value, args=None) -> bool:
  """The host's verdict on one site for an actual `value` (and a predicate's `args`)."""
  rec = site_values.encode_site_value(value)
  got = None if args is None else [site_values.encode_site_value(a)["value"] for a in args]
  dec = site_values.decode
  return instrument.matches(site, site.literal, rec["value"], dec, rec.get("truth"), got)


PREDICATES = b"""import unittest

from pkg import mod


def test_predicates():
  assert mod.is_even(4)
  assert not mod.is_even(3)
  assert mod.find(0) is None
  assert mod.find(1) is not None
  assert mod.flag() is True
  assert mod.sign(-3) < 0
  assert 0 < mod.sign(3)
  assert "a" in mod.letters()


class TestU(unittest.TestCase):
  def test_unittest(self):
    self.assertTrue(mod.is_even(2))
    self.assertFalse(mod.is_even(1))
    self.assertIsNone(mod.find(0))
"""


def test_truth_identity_and_order_checks_become_hidden_sites():
  """A predicate test (truthiness, `is None/True`, `<`, `in`, assertTrue...) has no `==`
  literal, and its pass used to be the in-process outcome (its decoys ended in a `raise`):
  each check is now a required site judged on the host from the value's canonical reading,
  so the rewritten file no longer even says which checks expect true and which false."""
  f2p = ["tests/test_p.py::test_predicates", "tests/test_p.py::TestU::test_unittest"]
  p = _plan("tests/test_p.py", PREDICATES, f2p)
  assert p.unprotected == {} and p.decoys.keys() == set(_sentinels(p.files["tests/test_p.py"]))
  ops = [(s.op, s.literal, s.flipped) for s in p.sites.values()]
  assert ops == [
    ("truthy", None, False),
    ("falsy", None, False),
    ("is", None, False),
    ("is not", None, False),
    ("is", True, False),
    ("<", 0, False),
    ("<", 0, True),
    ("in", "a", True),
    ("truthy", None, False),
    ("falsy", None, False),
    ("is", None, False),
  ]
  assert all(len(v) for v in p.required.values()) and len(p.required) == 2
  new = p.files["tests/test_p.py"].decode()
  body = "\n".join(new.splitlines()[5:21])
  for gone in ("assert", "not ", "is None", "is True", "< 0", "0 <", "assertTrue", "assertFalse"):
    assert gone not in body, gone

  def ok(sid, value):
    return _judge(p.sites[sid], value)

  class Truthy:  # true by the interpreter's default: no __bool__ or __len__
    pass

  class Lies:
    def __bool__(self):
      return True

  assert ok(1, True) and ok(1, [0]) and ok(1, Truthy()) and ok(1, re.match("a", "a"))
  assert not ok(1, False) and not ok(1, Lies()) and not ok(1, _subclass(int, 1))
  assert ok(2, 0) and ok(2, "") and not ok(2, Truthy()) and not ok(2, None.__class__)
  assert ok(3, None) and not ok(3, 0) and not ok(3, Truthy())
  assert ok(4, Truthy()) and ok(4, 0) and not ok(4, None)
  assert ok(5, True) and not ok(5, 1) and not ok(5, Lies())
  assert ok(6, -1) and not ok(6, 1) and not ok(6, Hedge())
  assert ok(7, 2) and not ok(7, -2)
  assert ok(8, ["a"]) and ok(8, "abc") and not ok(8, ("b",))


def test_the_run_order_is_the_hosts_and_the_harness_learns_no_decoy():
  """Which items are decoys, and where the real ones run among them, never enters the
  sandbox: the harness gets the helper's name only, and the items run in the order of the
  command line, a permutation drawn from the plan's host-side key."""
  plan = instrument.plan({"tests/test_m.py": SRC.encode()}, F2P, IDS, rng=random.Random(3))
  assert plan.harness_config() == {"helper": plan.helper}
  ids = plan.run_ids(IDS)
  order = plan.run_order(IDS)
  assert sorted(order) == sorted(ids) and order == plan.run_order(IDS)
  kinds = set()
  for seed in range(8):
    p = instrument.plan({"tests/test_m.py": SRC.encode()}, F2P, IDS, rng=random.Random(seed))
    kinds.add(tuple(p.split(i)[0] for i in p.run_order(IDS)))
  assert len(kinds) > 1  # real, decoy and other items in different orders


def test_a_literal_bound_to_a_local_is_hidden_like_an_inline_one():
  """`want = <literal>; assert x == want`: the local is only the expected side of `==`, so
  its literal leaves the process (the local binds None) and the check is a required site; a
  local that is also an input (`n` below) stays as it is."""
  src = (
    b"from pkg import f\n\n\ndef test_w():\n  want = {'k': [1, 2.5]}\n  n = 3\n"
    b"  assert f(n) == want\n  assert n == f(n)\n"
  )
  f2p = ["tests/test_w.py::test_w"]
  p = _plan("tests/test_w.py", src, f2p)
  new = p.files["tests/test_w.py"].decode()
  assert p.unprotected == {} and not p.decoyed and len(p.required["tests/test_w.py::test_w"]) == 1
  assert new.splitlines()[4] == "  want = None" and "'k'" not in new and "2.5" not in new
  assert new.splitlines()[7] == "  assert n == f(n)" and "== want" not in new
  (site,) = p.sites.values()
  assert site.literal == {"k": [1, 2.5]} and site.op == "=="


def test_a_str_predicate_is_called_on_the_host():
  """`assert s.startswith(p)`: the receiver and arguments are read and str's own method is
  called on the host, so a str subclass whose predicates say True has no reading and fails."""
  src = (
    b"from pkg import f\n\n\ndef test_s(who):\n  assert f().startswith('hello ')\n"
    b"  assert not f().endswith(who)\n  assert f().isascii()\n"
  )
  f2p = ["tests/test_s.py::test_s"]
  p = _plan("tests/test_s.py", src, f2p)
  new = p.files["tests/test_s.py"].decode()
  assert [(s.op, s.method) for s in p.sites.values()] == [
    ("truthy", "startswith"),
    ("falsy", "endswith"),
    ("truthy", "isascii"),
  ]
  assert "args=(('hello '), )" in new and "args=((who), )" in new and "args=())" in new

  def ok(sid, recv, *args):
    return _judge(p.sites[sid], recv, list(args))

  liar = _subclass(str, "bye", startswith=lambda s, p: True, endswith=lambda s, p: False)
  assert ok(1, "hello ada", "hello ") and not ok(1, "bye", "hello ") and not ok(1, liar, "hello ")
  assert ok(2, "hello bob", "ada") and not ok(2, "hello ada", "ada") and not ok(2, liar, "ada")
  assert ok(3, "abc") and not ok(3, "é") and not ok(3, object())
