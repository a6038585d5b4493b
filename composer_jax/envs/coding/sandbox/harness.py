"""The grader's test harness, run inside the sandbox as `python -I -S -B /cj/harness.py`.

It reads, from stdin, one line naming the outcome fd (written by sandbox.run) and a JSON
config; stdin is then at EOF. Before any project code runs it:
  1. makes this process non-dumpable: no other process of the sandbox (a test's child
     included) can open its /proc/PID/mem;
  2. installs the guard, a PEP 578 audit hook (hooks cannot be removed, and the hook keeps
     what it needs in its default arguments, whose replacement is itself an audited event).
     While code the candidate changed or added ("untrusted": a frame whose file is not the
     standard library, the runtime under /cj, or an unchanged file of the workspace) is on
     the stack — the nearest such frame, unless a trusted module's own import (`<module>`
     frame) comes first — the guard stops the run (record `guard`, exit status GUARD_EXIT) on:
     getting frames (sys._getframe, tracebacks', generators' and coroutines' frames) except
     through standard-library functions that use them internally (logging, typing,
     namedtuple, ...) or hand them to callers known by code-object identity, gc's object walks, trace/profile hooks, new audit hooks or
     interpreters, code objects and functions built from parts, reassigned function
     code/defaults, ctypes, marshal, pickles that name functions, starting programs, reading
     test or runner-config files, writing any .py under /ws, /proc/*/mem, and code compiled or
     executed under the name of a trusted file whose source it is not. In a thread other than
     the main one (pytest's), the introspection among these counts as the candidate's even
     with only trusted frames on that thread's stack;
  3. registers the plan's helper module under its random name: `site` (a hidden expected
     value's actual side, sent as plain data with validated conversions and a lying-value
     probe), `rows` and `perturb` (decoy tables, instrument.py);
  4. runs pytest with the reporter plugin: collected ids, one outcome per test item
     (setup/call/teardown merged), decoy items moved next to their twins.
Records are JSON lines `{"seq": n, "kind": ...}` on the outcome fd; the last is `done`. They
are plain data written by code in the candidate's process, so the host believes none of them
alone (runner.check, grader): what it checks is what the process could not know.
Standard library + pytest only; the host imports this file for GUARD_EXIT and `decode`.
"""

import base64
import dataclasses
import decimal
import fractions
import json
import keyword
import math
import os
import random
import sys
import threading
import types

GUARD_EXIT = 86
# Standard-library functions that get frames for their own use. "inner": no frame leaves the
# function; else the callers it may hand frames to ((file, function name): a trusted
# trampoline such as Mock(side_effect=logging.currentframe) would hand them on to the
# candidate). (File relative to the standard library, function name) -> kind. A caller is
# known by its code object's identity, captured before any project code runs (standard
# library) or when its module's code, checked against its file's source, runs (freezegun).
_FRAME_USERS = {
  ("collections/__init__.py", "namedtuple"): "inner",
  ("typing.py", "_caller"): "inner",
  ("enum.py", "_create_"): "inner",
  ("enum.py", "__call__"): "inner",
  ("traceback.py", "extract_stack"): "inner",
  ("traceback.py", "format_stack"): "inner",
  ("traceback.py", "print_stack"): "inner",
  ("warnings.py", "warn"): "inner",
  ("logging/__init__.py", "<lambda>"): (("logging/__init__.py", "findCaller"),),
  ("logging/__init__.py", "currentframe"): (("logging/__init__.py", "findCaller"),),
  ("inspect.py", "currentframe"): (("freezegun/api.py", "_should_use_real_time"),),
  ("traceback.py", "walk_stack"): (("traceback.py", "extended_frame_gen"),),
  ("traceback.py", "walk_tb"): (("traceback.py", "extended_frame_gen"),),
  ("traceback.py", "_walk_tb_with_full_positions"): (
    ("traceback.py", "_extract_from_extended_frame_gen"),
  ),
  ("warnings.py", "_next_external_frame"): (("warnings.py", "warn"),),
}
# Standard-library functions that generate code from text made of identifiers (a dataclass's
# __init__, a namedtuple's __new__: file name "<string>"). What they exec while no frame of the
# candidate's is on the stack is trusted like its maker, if the text is made of identifiers
# only: namedtuple checks its names itself; dataclasses' _create_fn only when called by
# _process_class on fields whose names are identifiers (read through the slot, not the
# object), so no text reaches it from a trampoline (a pytest cleanup calling _create_fn with
# the candidate's arguments) or from annotations. The candidate's own dataclasses stay
# untrusted.
_CODE_MAKERS = frozenset(
  {("dataclasses.py", "_create_fn"), ("collections/__init__.py", "namedtuple")}
)
_CONSUMER_MODULES = ("logging", "traceback", "warnings")  # imported before the guard
_KEYWORDS = frozenset(keyword.kwlist)
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_FUNC_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
_ALWAYS = frozenset(
  {
    "gc.get_objects",
    "gc.get_referrers",
    "gc.get_referents",
    "sys.settrace",
    "sys.setprofile",
    "sys.addaudithook",
    "code.__new__",
    "function.__new__",
    "cpython.PyInterpreterState_New",
    "cpython.run_command",
    "cpython.run_file",
    "cpython.run_module",
    "cpython.run_startup",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "subprocess.Popen",
    "pty.spawn",
    "marshal.loads",
    "marshal.load",
    "ctypes.dlopen",
    "ctypes.dlsym",
    "ctypes.dlsym/handle",
    "ctypes.cdata",
    "ctypes.cdata/buffer",
    "ctypes.string_at",
    "ctypes.wstring_at",
    "ctypes.addressof",
    "ctypes.call_function",
    "ctypes.create_string_buffer",
    "ctypes.create_unicode_buffer",
    "ctypes.set_errno",
    "ctypes.get_errno",
  }
)
# Introspection that no thread other than the main one (where pytest runs) needs: there, it
# counts as the candidate's even without a frame of its code (a builtin handed to a thread
# pool runs under threading's frames only).
_THREADED = frozenset(
  {
    "gc.get_objects",
    "gc.get_referrers",
    "gc.get_referents",
    "sys._getframe",
    "sys._current_frames",
    "object.__getattr__",
    "sys.settrace",
    "sys.setprofile",
    "code.__new__",
    "function.__new__",
    "marshal.loads",
    "ctypes.dlopen",
    "ctypes.dlsym",
    "ctypes.cdata",
    "ctypes.call_function",
  }
)
_CHECKED = frozenset(
  {
    "sys._getframe",
    "sys._current_frames",
    "object.__getattr__",
    "object.__setattr__",
    "open",
    "os.rename",
    "compile",
    "exec",
    "pickle.find_class",
  }
)
# Functions a pickle may name; everything else it names must be a class.
_PICKLE_FUNCS = frozenset(
  {
    ("copyreg", "_reconstructor"),
    ("copyreg", "__newobj__"),
    ("copyreg", "__newobj_ex__"),
    ("_codecs", "encode"),
    ("codecs", "encode"),
  }
)


def _same_const(x, y) -> bool:
  if type(x) is not type(y):
    return False
  if isinstance(x, types.CodeType):
    return _same_code(x, y)
  if isinstance(x, tuple):
    return len(x) == len(y) and all(_same_const(a, b) for a, b in zip(x, y))
  if isinstance(x, frozenset):  # iteration order depends on insertion: compare as sets
    return x == y
  return repr(x) == repr(y)


def _same_code(a, b) -> bool:
  """Whether code objects a and b were compiled from the same source (nested code too)."""
  if a.co_code != b.co_code or a.co_names != b.co_names or a.co_varnames != b.co_varnames:
    return False
  if a.co_filename != b.co_filename:
    return False
  return _same_const(a.co_consts, b.co_consts)


def _codes(objs):
  """Every code object of functions among `objs` (classes' methods, nested code too)."""
  todo, out = [], []
  for obj in objs:
    for v in vars(obj).values() if isinstance(obj, type) else (obj,):
      code = getattr(getattr(v, "__func__", v), "__code__", None)
      if isinstance(code, types.CodeType):
        todo.append(code)
  while todo:
    code = todo.pop()
    out.append(code)
    todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
  return out


def _consumers(stdlib: str) -> tuple[dict, frozenset]:
  """(id -> (code, (file, name))) of the frame users' allowed callers in the standard library,
  and the (file, name) of those elsewhere, captured when their module runs."""
  import importlib

  wanted = {pair for kind in _FRAME_USERS.values() if kind != "inner" for pair in kind}
  found = {}
  for name in _CONSUMER_MODULES:
    mod = importlib.import_module(name)
    for code in _codes(list(vars(mod).values())):
      fn = code.co_filename
      pair = (fn[len(stdlib) :], code.co_name)
      if fn.startswith(stdlib) and pair in wanted:
        found[id(code)] = (code, pair)
  later = frozenset(p for p in wanted if p[0].split("/")[0] not in _CONSUMER_MODULES)
  return found, later


def _dataclass_fields_ok(frame, process, field_type, name_of, type_dict, name_slot) -> bool:
  """Whether dataclasses' _create_fn (frame) was called by _process_class (within 3 frames of
  dataclasses' own code) on fields of exact type Field whose names, read through the slot
  captured before any project code ran, are identifiers."""
  for _ in range(4):
    frame = frame.f_back
    if frame is None or frame.f_code.co_filename != process.co_filename:
      return False
    if frame.f_code is process:
      break
  else:
    return False
  fields = frame.f_locals.get("fields")
  if type(fields) is not dict or type_dict(field_type).get("name") is not name_slot:
    return False
  for f in dict.values(fields):
    if type(f) is not field_type:
      return False
    name = name_of(f)
    if type(name) is not str or not str.isidentifier(name) or name in _KEYWORDS:
      return False
  return True


def install_guard(cfg: dict, fd: int) -> None:
  """Installs the audit hook (module docstring) for the workspace described by `cfg`:
  trusted = files of the workspace the change did not touch, protected = test and runner
  configuration files, guard = "enforce" (stop the run) or "report" (record only)."""
  import builtins
  import sysconfig

  b = builtins
  stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"]) + "/"
  trusted_files = frozenset(cfg.get("trusted", ()))
  protected = frozenset(cfg.get("protected", ()))
  enforce = cfg.get("guard", "enforce") == "enforce"
  main_thread = threading.get_ident()
  allowed, later = _consumers(stdlib)
  process = dataclasses._process_class.__code__
  name_slot = dataclasses.Field.__dict__["name"]

  # Everything the hook uses is a default argument: the candidate can reach neither the hook
  # (no gc, no frames) nor its defaults, and replacing `__defaults__` is an audited event. Its
  # state (re-entrancy flag, caches) is mutable on purpose, for the same reason.
  def hook(  # noqa: B006 (mutable defaults: see above)
    event,
    args,
    _checked=_CHECKED,
    _always=_ALWAYS,
    _getframe=sys._getframe,
    _write=os.write,
    _exit=os._exit,
    _dumps=json.dumps,
    _realpath=os.path.realpath,
    _fspath=os.fspath,
    _isinstance=b.isinstance,
    _type=b.type,
    _str=b.str,
    _int=b.int,
    _bytes=b.bytes,
    _getattr=b.getattr,
    _open=b.open,
    _compile=b.compile,
    _base=b.BaseException,
    _code_type=types.CodeType,
    _function_type=types.FunctionType,
    _same=_same_code,
    _state=[0],  # noqa: B006
    _cache={},  # noqa: B006
    _refs={},  # noqa: B006
    _stdlib=stdlib,
    _trusted=trusted_files,
    _protected=protected,
    _enforce=enforce,
    _fd=fd,
    _code=GUARD_EXIT,
    _users=_FRAME_USERS,
    _allowed=allowed,
    _later=later,
    _makers=_CODE_MAKERS,
    _fields_ok=_dataclass_fields_ok,
    _process=process,
    _field_type=dataclasses.Field,
    _name_of=name_slot.__get__,
    _type_dict=type.__dict__["__dict__"].__get__,
    _name_slot=name_slot,
    _made={},  # noqa: B006 (id -> code object made by trusted work, kept alive)
    _frame_attrs=_FRAME_ATTRS,
    _func_attrs=_FUNC_ATTRS,
    _pickle_funcs=_PICKLE_FUNCS,
    _modules=sys.modules,
    _threaded=_THREADED,
    _ident=threading.get_ident,
    _main=main_thread,
  ):
    if _state[0] or (event not in _always and event not in _checked):
      return
    if event == "object.__getattr__" and args[1] not in _frame_attrs:
      return
    if event == "object.__setattr__" and not (
      _isinstance(args[0], _function_type) and args[1] in _func_attrs
    ):
      return
    _state[0] = 1
    try:
      why = None

      def trusted(name):
        ok = _cache.get(name)
        if ok is None:
          ok = _cache[name] = (
            (name.startswith(_stdlib) and "-packages/" not in name)
            or name.startswith("/cj/")
            or name.startswith("<frozen ")
            or name in _trusted
          )
        return ok

      def reference(name):  # (source, code compiled from it) of a trusted file
        ref = _refs.get(name)
        if ref is None:
          with _open(name, "rb") as fh:
            src = fh.read()
          ref = _refs[name] = (src, _compile(src, name, "exec", dont_inherit=True))
        return ref

      if event == "exec" and _isinstance(args[0], _code_type) and args[0].co_name == "<module>":
        # A module that holds allowed frame consumers (freezegun's api): its code objects,
        # if it is its trusted file's source.
        fn = args[0].co_filename
        for path, name in _later:
          if (
            _isinstance(fn, _str)
            and fn.endswith("/" + path)
            and trusted(fn)
            and _same(args[0], reference(fn)[1])
          ):
            todo = [args[0]]
            while todo:
              c = todo.pop()
              if c.co_name == name:
                _allowed[id(c)] = (c, (path, name))
              todo.extend(k for k in c.co_consts if _isinstance(k, _code_type))

      # The culprit: the nearest frame of untrusted code. A trusted module's own import
      # (its `<module>` frame, met first) is trusted work even when the candidate imported it.
      caller = _getframe(1)
      culprit, imported = caller, False
      while culprit is not None:
        code = culprit.f_code
        if not trusted(code.co_filename) and _made.get(id(code)) is not code:
          break
        if code.co_name == "<module>":
          imported = True
          break
        culprit = culprit.f_back
      if imported or culprit is None:
        fn = caller.f_code.co_filename
        if (
          event == "exec"
          and (imported or _ident() == _main)
          and fn.startswith(_stdlib)
          and (fn[len(_stdlib) :], caller.f_code.co_name) in _makers
          and (
            caller.f_code.co_name != "_create_fn"
            or _fields_ok(caller, _process, _field_type, _name_of, _type_dict, _name_slot)
          )
        ):
          made = [args[0]]
          while made:
            c = made.pop()
            if _isinstance(c, _code_type):
              _made[id(c)] = c
              made.extend(c.co_consts)
        if imported:
          return
      if culprit is None:
        if event not in _threaded or _ident() == _main:
          return
        culprit = caller  # a thread of the candidate's that runs only trusted frames
      if event in _always:
        why = event
        if event.startswith("marshal.") and caller.f_code.co_filename.startswith("<frozen "):
          why = None  # importlib reading bytecode; what it loads is checked at exec
      elif event in ("sys._getframe", "sys._current_frames", "object.__getattr__"):
        code = caller.f_code
        fn = code.co_filename
        kind = _users.get((fn[len(_stdlib) :], code.co_name)) if fn.startswith(_stdlib) else None
        consumer = caller.f_back
        if kind == "inner":
          return
        if kind is not None and consumer is not None:  # the callers it may hand frames to
          known = _allowed.get(id(consumer.f_code))
          if known is not None and known[0] is consumer.f_code and known[1] in kind:
            return
        why = event if event != "object.__getattr__" else f"frame access .{args[1]}"
      elif event == "object.__setattr__":
        why = f"function {args[1]} reassigned"
      elif event in ("open", "os.rename"):
        path = args[1] if event == "os.rename" else args[0]
        if _isinstance(path, _int):
          return
        path = _realpath(_fspath(path))
        if _isinstance(path, _bytes):
          path = path.decode("utf-8", "surrogateescape")
        mode, flags = (args[1], args[2]) if event == "open" else ("w", 1)
        writing = (
          _isinstance(mode, _str) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)
        ) or (_isinstance(flags, _int) and flags & 3)
        if writing and path.startswith("/ws/") and path.endswith(".py"):
          why = f"writes {path}"
        elif path in _protected:
          why = f"reads {path}"
        elif path.startswith("/proc/") and path.endswith("/mem"):
          why = f"opens {path}"
      elif event in ("compile", "exec"):
        code = args[0]
        name = code.co_filename if event == "exec" else args[1]
        if _isinstance(name, _bytes):
          name = name.decode("utf-8", "surrogateescape")
        if not _isinstance(name, _str) or name.startswith("<frozen ") or not trusted(name):
          return
        if event == "exec" and not _isinstance(code, _code_type):
          return
        ref = reference(name)
        if event == "compile":
          same = _isinstance(code, _bytes) and code == ref[0]
        else:
          same = code.co_name != "<module>" or _same(code, ref[1])
        if not same:
          why = f"code under the name of {name} that is not its source"
      elif event == "pickle.find_class":
        mod, name = args
        obj = _getattr(_modules.get(mod), name, None) if _isinstance(name, _str) else None
        if not _isinstance(obj, _type) and (mod, name) not in _pickle_funcs:
          why = f"pickle names {mod}.{name}"
      if why is None:
        return
      where = f"{culprit.f_code.co_filename}:{culprit.f_lineno}"
    except _base:
      why, where = "the guard could not judge an event", "?"
    finally:
      _state[0] = 0
    try:
      body = _dumps({"seq": -1, "kind": "guard", "event": why, "where": where})
    except _base:
      body = '{"seq": -1, "kind": "guard", "event": "?", "where": "?"}'
    try:
      _write(_fd, (body + "\n").encode())
    except _base:
      pass
    if _enforce:
      _exit(_code)

  sys.addaudithook(hook)


def _non_dumpable() -> None:
  """prctl(PR_SET_DUMPABLE, 0): this process's memory is closed to the sandbox's others."""
  import ctypes

  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(4, 0, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


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


# -- plain-data encoding of a site's actual value -------------------------------------------

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


# -- the helper module the rewritten tests import -------------------------------------------


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



def helper_module(name: str, chan, current: list) -> types.ModuleType:
  """The module `instrument.py`'s rewritten test files import as `name`."""
  mod = types.ModuleType(name)
  rng = random.Random()

  def site(sid, value, token=None):
    rec = encode_site_value(value)
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
  """pytest plugin: collected ids, one outcome per item, the current item for sites, decoys
  ordered next to their twins."""

  def __init__(self, chan: Channel, plan: dict, current: list):
    self.chan, self.phases, self.current = chan, {}, current
    self.decoys, self.before = plan.get("decoys", {}), plan.get("before", {})

  def pytest_collection_modifyitems(self, items):
    if not self.decoys:
      return
    name = lambda it: getattr(it, "originalname", None) or it.name.split("[", 1)[0]
    loose = [it for it in items if name(it) in self.decoys]
    rest = [it for it in items if name(it) not in self.decoys]
    for decoy in sorted({name(it) for it in loose}):
      mine = [it for it in loose if name(it) == decoy]
      twin = self.decoys[decoy]
      parent = mine[0].parent
      at = [i for i, it in enumerate(rest) if name(it) == twin and it.parent is parent]
      pos = (at[0] if self.before.get(decoy) else at[-1] + 1) if at else len(rest)
      rest[pos:pos] = mine
    items[:] = rest

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
  _non_dumpable()
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
  current = [None]
  plan = cfg.get("plan") or {}
  if plan.get("helper"):
    sys.modules[plan["helper"]] = helper_module(plan["helper"], chan, current)
  install_guard(cfg, fd)
  import pytest

  plugin = Reporter(chan, plan, current)
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
