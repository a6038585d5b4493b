"""The grader's test harness, run inside the sandbox as `python -I -S -B /cj/harness.py`.

Before any project code is imported it reads, from stdin, the outcome-channel fd (first line,
written by sandbox.run) and a JSON config holding a per-run HMAC key; stdin is then at EOF, so
the key exists only in this process's memory — never in the sandbox's files, argv or
environment. Every outcome goes to the channel fd (a pipe to the host, close-on-exec) as a line
`hex(HMAC-SHA256(key, body)) body`, body = JSON with a sequence number; stdout, stderr and files
carry nothing the host believes.

Two modes, two mechanisms:
  "pytest": outcomes from pytest's own reports (setup/call/teardown of every item) and the
            collected node ids; the coverage-data file is sent back when asked (testmap).
  "direct": a fresh interpreter; each Function item's test function is called by this harness
            itself (pytest only resolves fixtures), other items (doctests) are judged by a
            wrapper around pytest_runtest_call — never by pytest's reports.
Both snapshot the runner (every function and class attribute of pytest, _pytest, pluggy, this
harness and the loaded standard library, and the builtins) after importing pytest and before importing project code, and report
every binding that differs at the end; both run a canary (a true and a false comparison and
assert) before and after the tests. The host rejects the run if either shows tampering.
Standard library + pytest only; this file is also imported by the host for `verify`.
"""

import ast
import base64
import builtins
import functools
import hashlib
import hmac
import inspect
import json
import os
import sys
import types

# The runner and, through sys.stdlib_module_names, the standard library: a comparison helper
# (math.isclose, unittest's assertEqual, operator.eq) made to agree with anything is caught.
_WATCHED = frozenset({"pytest", "_pytest", "pluggy", "cj_harness", "__main__"})
_PRELOAD = ("unittest", "math", "cmath", "operator", "decimal", "fractions", "difflib", "pprint")
# Process-wide hooks and settings libraries legitimately set for good (sys.excepthook,
# logging.captureWarnings -> warnings.showwarning, coverage's threading trace hook); they decide
# no comparison. Module-level private names of the standard library are its own state.
_EXEMPT = frozenset({("warnings", "showwarning"), ("warnings", "formatwarning")})


def _exempt(owner: str, name: str) -> bool:
  if (owner, name) in _EXEMPT or (owner in ("sys", "threading") and name.endswith("hook")):
    return True
  stdlib_module = owner != "builtins" and owner in sys.modules
  stdlib_module = stdlib_module and owner.split(".")[0] in sys.stdlib_module_names
  return stdlib_module and name.startswith("_")


_MUTABLE_STATE = ("seq", "phases")  # the harness objects' own bookkeeping


def sign(key: bytes, body: bytes, _new=hmac.new, _sha=hashlib.sha256) -> bytes:
  return _new(key, body, _sha).hexdigest().encode()


def verify(key: bytes, blob: bytes) -> list[dict]:
  """Records of a channel blob; raises ValueError on any bad line, MAC or sequence gap."""
  out = []
  lines = blob.split(b"\n")
  if lines[-1] != b"":
    raise ValueError("channel ends mid-record")
  for i, line in enumerate(lines[:-1], 1):
    mac, _, body = line.partition(b" ")
    if not hmac.compare_digest(mac, sign(key, body)):
      raise ValueError(f"record {i} fails authentication")
    rec = json.loads(body)
    if not isinstance(rec, dict) or rec.get("seq") != i:
      raise ValueError(f"record {i} out of sequence")
    out.append(rec)
  return out


class Channel:
  """The write end of the outcome pipe; what `send` needs is bound when this file loads."""

  def __init__(self, fd: int, key: bytes):
    self.fd, self._key, self.seq = fd, key, 0
    os.set_inheritable(fd, False)

  def send(self, kind: str, _dumps=json.dumps, _sign=sign, _write=os.write, **data):
    self.seq += 1
    body = _dumps({"seq": self.seq, "kind": kind, **data}, sort_keys=True).encode()
    view = memoryview(_sign(self._key, body) + b" " + body + b"\n")
    while view:
      view = view[_write(self.fd, view) :]


def _parts(obj) -> tuple:
  """What must stay the same object: the binding and, for functions, its code and defaults."""
  return (
    obj,
    getattr(obj, "__code__", None),
    getattr(obj, "__defaults__", None),
    getattr(obj, "__kwdefaults__", None),
  )


def _bindings(*instances) -> dict:
  """(owner, name) -> _parts for the runner modules' functions/classes, the builtins, and
  the attributes of the harness's own objects (plugin, channel)."""
  out = {("builtins", k): _parts(v) for k, v in vars(builtins).items()}
  for modname, mod in list(sys.modules.items()):
    top = modname.split(".")[0]
    if mod is None or (top not in _WATCHED and top not in sys.stdlib_module_names):
      continue
    for name, obj in list(vars(mod).items()):
      if callable(obj) or isinstance(obj, type(sys)):
        out[(modname, name)] = _parts(obj)
      if isinstance(obj, type) and getattr(obj, "__module__", "") == modname:
        for attr, val in list(vars(obj).items()):
          if callable(val) or isinstance(val, (staticmethod, classmethod, property)):
            out[(f"{modname}.{name}", attr)] = _parts(val)
  for i, inst in enumerate(instances):
    out[(f"instance{i}", "__class__")] = (type(inst),)
    out[(f"instance{i}", "__keys__")] = ("\0".join(sorted(map(str, vars(inst)))),)
    for k, v in vars(inst).items():
      if k not in _MUTABLE_STATE:
        out[(f"instance{i}", k)] = (v,)
  return out


def _same(a, b) -> bool:
  """Identity, or equality for plain str/int (never a candidate-defined __eq__)."""
  return a is b or (type(a) is type(b) and type(a) in (str, int) and a == b)


def _changed(before: dict, *instances) -> list[str]:
  after = _bindings(*instances)
  bad = []
  for key, parts in before.items():
    if _exempt(*key):
      continue
    now = after.get(key, parts)
    if len(now) != len(parts) or not all(_same(a, b) for a, b in zip(now, parts)):
      bad.append(f"{key[0]}.{key[1]}")
  return sorted(bad)


def canary() -> bool:
  """True iff a true and a false comparison, and a failing assert, behave normally."""
  try:
    assert [1.5, "a"] == [1.5, "a"] and not (2.0 == 3.0) and 2 + 2 != 5
    try:
      assert 2.0 == 3.0
    except AssertionError:
      return True
    return False
  except BaseException:
    return False


class Reporter:
  """pytest plugin (mode "pytest"): outcomes from pytest's reports."""

  def __init__(self, chan: Channel):
    self.chan, self.phases = chan, {}

  def pytest_collection_finish(self, session):
    self.chan.send("collected", ids=[item.nodeid for item in session.items])

  def pytest_collectreport(self, report):
    if report.failed:
      self.chan.send("collect_error", id=report.nodeid)

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


@functools.cache
def _compiled(path: str) -> dict:
  """(qualname, first line) -> code object, and the same -> 'bare' (no wrapping decorator),
  for every function compiled from the file at `path` as it is on disk (read-only here)."""
  with open(path, "rb") as f:
    src = f.read()
  codes, todo = {}, [compile(src, path, "exec", dont_inherit=True)]
  while todo:
    code = todo.pop()
    codes[(code.co_qualname, code.co_firstlineno)] = code
    todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
  for node in ast.walk(ast.parse(src)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      first = min([node.lineno] + [d.lineno for d in node.decorator_list])
      marks = all("mark" in ast.unparse(d).split("(")[0] for d in node.decorator_list)
      codes[("bare", node.name, first)] = marks
  return codes


def _same_code(a, b) -> bool:
  if a.co_code != b.co_code or a.co_names != b.co_names or a.co_varnames != b.co_varnames:
    return False
  if len(a.co_consts) != len(b.co_consts):
    return False
  for x, y in zip(a.co_consts, b.co_consts):
    if type(x) is not type(y):
      return False
    if isinstance(x, types.CodeType) and not _same_code(x, y):
      return False
    if not isinstance(x, types.CodeType) and repr(x) != repr(y):
      return False
  return True


def pristine(func, frozen) -> bool:
  """Whether test function `func` is one compiled from a grader-owned, read-only test file
  (its own module's, or another's for a test inherited from a base class)."""
  inner = inspect.unwrap(getattr(func, "__func__", func))
  code = getattr(inner, "__code__", None)
  if code is None or code.co_filename not in frozen:
    return False
  try:
    codes = _compiled(code.co_filename)
  except (OSError, SyntaxError, ValueError):
    return False
  want = codes.get((code.co_qualname, code.co_firstlineno))
  if want is None or not _same_code(code, want):
    return False
  bare = codes.get(("bare", code.co_name, code.co_firstlineno), False)
  return not bare or getattr(func, "__func__", func) is inner


class Direct:
  """pytest plugin (mode "direct"): the harness calls each test itself, and only a test
  function whose code is the one compiled from the (read-only) test file."""

  def __init__(self, chan: Channel, frozen=()):
    self.chan, self.frozen = chan, frozenset(frozen)

  def pytest_collection_finish(self, session):
    self.chan.send("collected", ids=[item.nodeid for item in session.items])

  def pytest_pyfunc_call(self, pyfuncitem):
    args = {a: pyfuncitem.funcargs[a] for a in pyfuncitem._fixtureinfo.argnames}
    if not pristine(pyfuncitem.obj, self.frozen):
      self.chan.send("call", id=pyfuncitem.nodeid, ok=False, why="test function replaced")
      raise RuntimeError("cj harness: the test function is not the one in its file")
    try:
      result = pyfuncitem.obj(**args)
    except BaseException:
      self.chan.send("call", id=pyfuncitem.nodeid, ok=False)
      raise
    ok = not hasattr(result, "__await__") and not hasattr(result, "__next__")
    self.chan.send("call", id=pyfuncitem.nodeid, ok=ok)
    return True

  def pytest_runtest_call(self, item):
    if not hasattr(item, "_fixtureinfo") or type(item).__name__ != "Function":
      try:
        item.runtest()
      except BaseException:
        self.chan.send("call", id=item.nodeid, ok=False)
        raise
      self.chan.send("call", id=item.nodeid, ok=True)
      item.runtest = lambda: None  # already run; pytest's own call then does nothing


def _hookimpls(pytest, plugin) -> None:
  """Marks the plugin's hooks tryfirst (before project conftests and pytest's defaults)."""
  for name in ("pytest_pyfunc_call", "pytest_runtest_call"):
    fn = getattr(type(plugin), name, None)
    if fn is not None:
      pytest.hookimpl(tryfirst=True)(fn)


def main() -> None:
  fd = int(sys.stdin.buffer.readline())
  cfg = json.loads(sys.stdin.buffer.read())
  os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # stdin is spent; tests see an empty one
  sys.stdin = open(os.devnull)
  chan = Channel(fd, bytes.fromhex(cfg.pop("key")))
  # The runtime first (a workspace `pytest.py` cannot stand in for it), the workspace after the
  # standard library.
  sys.path[:0] = [cfg["site"]]
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
  sys.modules["cj_harness"] = sys.modules[__name__]
  import pytest

  plugin = Reporter(chan) if cfg["mode"] == "pytest" else Direct(chan, cfg["frozen"])
  _hookimpls(pytest, plugin)
  for name in _PRELOAD:
    __import__(name)
  before = _bindings(chan, plugin)
  ok_before = canary()
  rc = int(pytest.main(cfg["args"], plugins=[plugin]))
  tampered = _changed(before, chan, plugin)
  done = {"rc": rc, "tampered": tampered[:20], "canary": ok_before and canary()}
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
