"""The grader's test harness, run inside the sandbox as `python -I -S -B /cj/harness.py`.

It reads, from stdin, one line naming the outcome fd (written by bwrap.run) and a JSON
config; stdin is then at EOF. Before any project code runs it:
  1. makes this process non-dumpable: no other process of the sandbox (a test's child
     included) can open its /proc/PID/mem;
  2. installs the guard (guard.py, bound as /cj/site/cj_guard.py), a PEP 578 audit hook that
     stops the run when the candidate's code introspects, builds code or starts programs;
  3. registers the plan's helper module under its random name: `site` (a hidden expected
     value's actual side, sent as plain data with validated conversions and a lying-value
     probe: site_values.py, bound as /cj/site/cj_values.py), `rows` and `perturb` (decoy
     tables, instrument/);
  4. runs pytest with the reporter plugin: collected ids, one outcome per test item
     (setup/call/teardown merged). Items run in the order of the command line, which the host
     drew (instrument.Plan.run_order); nothing here knows which are decoys.
Records are JSON lines `{"seq": n, "kind": ...}` on the outcome fd; the last is `done`. They
are plain data written by code in the candidate's process, so the host believes none of them
alone (runner.check, grader): what it checks is what the process could not know.
Standard library + pytest only; the host never imports this file (its pieces it needs are in
guard.py and site_values.py).
"""

import base64
import json
import os
import random
import sys
import types


class Channel:
  """The write end of the outcome pipe (close-on-exec): JSON lines with a sequence number."""

  def __init__(self, fd: int):
    self.fd, self.seq = fd, 0
    os.set_inheritable(fd, False)

  def send(self, kind: str, _dumps=json.dumps, _write=os.write, **data):
    self.seq += 1
    body = _dumps({"seq": self.seq, "kind": kind, **data}, sort_keys=True)
    view = memoryview((body + "\n").encode("utf-8", "surrogatepass"))
    while view:
      view = view[_write(self.fd, view) :]


# -- the helper module the rewritten tests import -------------------------------------------


def helper_module(name: str, chan, current: list, values) -> types.ModuleType:
  """The module `instrument/`'s rewritten test files import as `name` (`values`: site_values)."""
  encode_site_value, perturb = values.encode_site_value, values.perturb
  mod = types.ModuleType(name)
  rng = random.Random()

  def site(sid, value, token=None, args=None):
    rec = encode_site_value(value)
    if args is not None:  # a str predicate's arguments: the host calls it (record.matches)
      rec["args"] = [encode_site_value(a)["value"] for a in args]
    if token is not None:  # a parametrized expected value: the row's token
      rec["token"] = token if isinstance(token, str) else repr(token)[:100]
    chan.send("site", test=current[0], site=sid, **rec)

  def perturb_any(v):
    """`perturb` for plain data, else a value equal to nothing."""
    out = perturb(v, rng)
    return _Unequal() if out is None else out

  def rows(values, n, col):
    """A parametrize table with column `col` perturbed (pytest.param rows keep marks, id)."""
    if iter(values) is values:  # an iterator the real test's table needs whole
      return []
    import pytest

    out = []
    for row in values:
      if isinstance(row, type(pytest.param(None))):
        vals = list(row.values)
        if col < len(vals):
          vals[col] = perturb_any(vals[col])
        out.append(pytest.param(*vals, marks=row.marks, id=row.id))
      elif n == 1:
        out.append(perturb_any(row))
      else:
        row = list(row)
        if col < len(row):
          row[col] = perturb_any(row[col])
        out.append(tuple(row))
    return out

  mod.site, mod.perturb, mod.rows = site, perturb_any, rows
  return mod


class _Unequal:
  def __eq__(self, other):
    return False

  def __ne__(self, other):
    return True

  __hash__ = object.__hash__


# -- the reporter ---------------------------------------------------------------------------


class Reporter:
  """pytest plugin: collected ids, one outcome per item, the current item for sites. It holds
  nothing of the plan (which items are decoys, where the real tests are): reaching it tells
  the candidate's code nothing."""

  def __init__(self, chan: Channel, current: list):
    self.chan, self.phases, self.current = chan, {}, current

  def pytest_collection_finish(self, session):
    self.chan.send("collected", ids=[item.nodeid for item in session.items])

  def pytest_collectreport(self, report):
    if report.failed:
      self.chan.send("collect_error", id=report.nodeid)

  def pytest_runtest_logstart(self, nodeid, location):
    self.current[0] = nodeid

  def pytest_runtest_logreport(self, report):
    self.phases.setdefault(report.nodeid, {})[report.when] = report.outcome
    if report.when == "teardown":
      ph = self.phases.pop(report.nodeid)
      if ph.get("setup") == "failed" or ph.get("teardown") == "failed":
        outcome = "error"
      elif ph.get("call") == "failed":
        outcome = "failed"
      elif ph.get("call") == "passed" and ph.get("setup") == "passed":
        outcome = "passed"
      else:
        outcome = "skipped"
      self.chan.send("test", id=report.nodeid, outcome=outcome)
      self.current[0] = None


def main() -> None:
  fd = int(sys.stdin.buffer.readline())
  cfg = json.loads(sys.stdin.buffer.read())
  os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # stdin is spent; tests see an empty one
  sys.stdin = open(os.devnull)
  chan = Channel(fd)
  # The runtime first (a workspace `pytest.py` cannot stand in for it), the workspace after the
  # standard library.
  sys.path[:0] = [cfg["site"]]
  import cj_guard  # the grader's runtime (suite.runtime_binds)
  import cj_values

  cj_guard.non_dumpable()
  sys.path += cfg["paths"]
  # This process runs isolated (-I ignores PYTHONPATH); the processes a test starts do not, and
  # import the project through it (never the runner's site).
  os.environ["PYTHONPATH"] = os.pathsep.join(cfg["paths"])
  # -S skips site.main(); the builtins it adds (help, exit, quit, copyright, ...) are set
  # without its sys.path changes: suites check against them (simpleeval's disallowed list).
  import site

  site.setquit()
  site.setcopyright()
  site.sethelper()
  current = [None]
  plan = cfg.get("plan") or {}
  if plan.get("helper"):
    sys.modules[plan["helper"]] = helper_module(plan["helper"], chan, current, cj_values)
  cj_guard.install_guard(cfg, fd)
  import pytest

  plugin = Reporter(chan, current)
  rc = int(pytest.main(cfg["args"], plugins=[plugin]))
  done = {"rc": rc}
  if cfg.get("blob"):
    try:
      with open(cfg["blob"], "rb") as f:
        done["blob"] = base64.b64encode(f.read()).decode()
    except OSError:
      done["blob"] = None
  chan.send("done", **done)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(rc)


if __name__ == "__main__":
  main()
