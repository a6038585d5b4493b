"""The grader's guard: a PEP 578 audit hook installed in the harness (harness.py) before any
project code runs, inside the sandbox (bound as /cj/site/cj_guard.py; the host imports it for
GUARD_EXIT).

Hooks cannot be removed, and the hook keeps what it needs in its default arguments, whose
replacement is itself an audited event. While code the candidate changed or added
("untrusted": a frame whose file is not the standard library, the runtime under /cj, or an
unchanged file of the workspace) is on the stack — the nearest such frame, unless a trusted
module's own import (`<module>` frame) comes first — the guard stops the run (record `guard`,
exit status GUARD_EXIT) on: getting frames (sys._getframe, tracebacks', generators' and
coroutines' frames) except through standard-library functions that use them internally
(logging, typing, namedtuple, ...) or hand them to callers known by code-object identity,
gc's object walks, trace/profile hooks, new audit hooks or interpreters, code objects and
functions built from parts, reassigned function code/defaults, ctypes, marshal, pickles that
name functions, starting programs, reading test or runner-config files, writing any .py under
/ws, /proc/*/mem, and code compiled or executed under the name of a trusted file whose source
it is not. In a thread other than the main one (pytest's), the introspection among these
counts as the candidate's even with only trusted frames on that thread's stack. Standard
library only.
"""

import dataclasses
import json
import keyword
import os
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


def non_dumpable() -> None:
  """prctl(PR_SET_DUMPABLE, 0): this process's memory is closed to the sandbox's others."""
  import ctypes

  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(4, 0, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
