"""The coding agent's tools over a task's workspace: list, read, search, edit, write, append, run,
submit.

A `Session` holds one episode's workspace in memory (path -> bytes, the task's visible files
and its single-commit .git) and applies tool calls given as (name, raw JSON arguments), the
form a parsed model turn carries. File tools work on that mapping, so paths are confined by
construction: a path is normalized against the workspace root `/ws` (what the agent sees; the
sandbox's cwd), and one outside it is an error observation. `search` and `run` execute in the
bubblewrap sandbox (`bwrap.run`: no network, uid 1000, quotas, rlimits, a wall clock) on a
throwaway copy of the workspace with pytest importable, so what a command writes is not kept;
edits go through `edit` / `write_file`, which the monitor sees as file events.

Every call returns an `Observation` and never raises, whatever the model wrote: every argument
is checked before use (a JSON object of the declared parameters and types; strings that are
valid Unicode, without NUL in paths, patterns and commands; bounded lengths; a path whose
parent is a file, or a file the size of which passes MAX_FILE_BYTES, is refused), and an
unexpected failure inside a tool becomes a `failed` observation (logged) rather than an
exception that would stop a whole batch of episodes. Only a machine where the sandbox cannot
run raises (`bwrap.SandboxUnavailable`). `Observation.error` names what went wrong (one of
`ERRORS`), which the feedback kinds and episode metrics read:
  unknown_tool  a tool the session does not offer (the text lists the offered ones)
  bad_arguments arguments that are not a JSON object of the tool's parameters, or values
                that are not usable (NUL bytes, lone surrogates, over-long)
  outside       a path outside the workspace        not_found  no such file or directory
  no_match / ambiguous  `edit`'s old text found 0 / more than 1 times
  timeout       a command over its wall-clock limit  failed     a command's non-zero exit
  budget        a call after the turn, token or wall-time budget ran out
Each call also appends the monitor events it implies ({"type": "read"|"write", "path"} or
{"type": "command", "command"}, with the turn) to `Session.events`: `monitor.scan_trajectory`
reads them. Long observations keep their head and tail around a `[... N characters cut ...]`
marker.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
import re
import shlex
import time
from collections.abc import Mapping
from pathlib import Path

from composer_jax.codetasks import project
from composer_jax.codetasks.sandbox import bwrap, suite
from composer_jax.codetasks.task import Task, unified_diff

WORKSPACE = bwrap.WS
# pytest's "in 0.02s" (summary lines): dropped, so the same workspace gives the same observation.
_DURATION = re.compile(
  r"^(.*\b(?:passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?|no tests ran)\b"
  r".*?) in \d+\.\d+s(?: \(\d+:\d\d:\d\d\))?( =*)?$",
  re.M,
)
MAX_FILE_BYTES = 1 << 20  # one file the agent writes (the graded diff stays small and linear)
_MAX_STR = {"path": 4096, "pattern": 8192, "command": 65536, "tests": 4096}
ERRORS = (
  "unknown_tool",
  "bad_arguments",
  "outside",
  "not_found",
  "no_match",
  "ambiguous",
  "timeout",
  "failed",
  "budget",
)


@dataclasses.dataclass(frozen=True)
class Budget:
  """Per-episode budgets and per-call limits.

  max_turns: model turns; max_tokens: tokens of the whole episode (prompt, model turns and
  observations); wall_s: seconds from the episode's start; output_chars: longest observation;
  command: sandbox limits of one `run` / `search` (its wall_s is the command timeout).
  """

  max_turns: int = 30
  max_tokens: int = 32768
  wall_s: float = 600.0
  output_chars: int = 4000
  command: bwrap.Limits = bwrap.Limits(cpu_s=30, wall_s=30.0, log_bytes=256 << 10)

  def __post_init__(self):
    if min(self.max_turns, self.max_tokens, self.output_chars) < 1 or self.wall_s <= 0:
      raise ValueError(
        f"budget max_turns={self.max_turns}, max_tokens={self.max_tokens}, "
        f"output_chars={self.output_chars} must be >= 1 and wall_s={self.wall_s} > 0"
      )


DEFAULT_BUDGET = Budget()


@dataclasses.dataclass(frozen=True)
class Observation:
  """What one tool call returns to the model: its text, and '' or one of `ERRORS`."""

  text: str
  error: str = ""


def _fn(name: str, doc: str, props: dict, required: tuple[str, ...] = ()) -> dict:
  params = {"type": "object", "properties": props, "required": list(required)}
  return {"type": "function", "function": {"name": name, "description": doc, "parameters": params}}


_STR, _INT = {"type": "string"}, {"type": "integer"}
# Tool declarations in the function-calling schema chat templates render (OpenAI / Kimi).
TOOLS = (
  _fn("list_dir", "List a directory of the workspace.", {"path": _STR}),
  _fn(
    "read_file",
    "Read a file with line numbers; optionally lines start_line..end_line (1-based).",
    {"path": _STR, "start_line": _INT, "end_line": _INT},
    ("path",),
  ),
  _fn(
    "search",
    "grep -rnE a regular expression under a path.",
    {"pattern": _STR, "path": _STR},
    ("pattern",),
  ),
  _fn(
    "edit",
    "Replace the one exact occurrence of old_text in a file by new_text.",
    {"path": _STR, "old_text": _STR, "new_text": _STR},
    ("path", "old_text", "new_text"),
  ),
  _fn(
    "write_file",
    "Create or overwrite a file.",
    {"path": _STR, "content": _STR},
    ("path", "content"),
  ),
  # Short arguments for small models: a new function is appended, with no text to match.
  _fn(
    "append", "Append code to the end of a file.", {"path": _STR, "code": _STR}, ("path", "code")
  ),
  _fn(
    "run",
    "Run a shell command in a throwaway copy of the workspace (file changes are not kept), "
    "or the visible tests (tests: paths, or [] for all) with pytest.",
    {"command": _STR, "tests": {"type": "array", "items": _STR}},
  ),
  _fn("submit", "Finish: the workspace as it is now is graded.", {}),
)
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)


def truncate(text: str, limit: int) -> str:
  """`text`, or its head and tail around a '[... N characters cut ...]' marker."""
  if len(text) <= limit:
    return text
  cut = len(text) - limit
  head = limit // 2
  return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[len(text) - (limit - head) :]}"


def rel_path(path: str) -> str | None:
  """Workspace-relative POSIX path of `path` (relative, or absolute under /ws); None outside."""
  if path.startswith("~"):
    return None
  full = posixpath.normpath(posixpath.join(WORKSPACE, path))
  if full == WORKSPACE:
    return "."
  if full.startswith(WORKSPACE + "/"):
    return full[len(WORKSPACE) + 1 :]
  return None


class Session:
  """One episode's workspace and tool calls (module docstring). Picklable: a worker process
  can step it."""

  def __init__(
    self, task: Task, budget: Budget = DEFAULT_BUDGET, tools: tuple[str, ...] = TOOL_NAMES
  ):
    self.check_tools(tools)
    self.task, self.budget, self.tools = task, budget, tuple(tools)
    with bwrap.scratch("agent") as tmp:
      names = project.unpack(task.workspace, Path(tmp))
      self.files = {n: (Path(tmp) / n).read_bytes() for n in names}
    self.base = dict(self.files)
    self.events: list[dict] = []
    self.turns, self.tokens, self.submitted = 0, 0, False
    self.start = time.monotonic()

  @staticmethod
  def check_tools(tools) -> None:
    """One-line ValueError unless `tools` is a non-empty selection of TOOL_NAMES with submit."""
    unknown = sorted(set(tools) - set(TOOL_NAMES))
    if unknown or "submit" not in tools:
      raise ValueError(
        f"tools {list(tools)}: unknown {unknown} or no 'submit'; valid: {list(TOOL_NAMES)}"
      )

  # -- budgets -------------------------------------------------------------------------------
  def over_budget(self) -> str:
    """'' while the episode may continue, else which budget ran out."""
    b = self.budget
    if self.turns >= b.max_turns:
      return f"turn budget {b.max_turns} used"
    if self.tokens >= b.max_tokens:
      return f"token budget {b.max_tokens} used"
    if time.monotonic() - self.start >= b.wall_s:
      return f"wall-time budget {b.wall_s:g} s used"
    return ""

  # -- the call ------------------------------------------------------------------------------
  def call(self, name, arguments, turn: int = -1) -> Observation:
    """Applies one tool call (raw JSON `arguments`) made at trajectory turn `turn`; never
    raises for any `name` / `arguments` (module docstring)."""
    if not isinstance(name, str) or name not in self.tools:
      return Observation(
        f"error: unknown tool {name!r}; available tools: {', '.join(self.tools)}", "unknown_tool"
      )
    if why := self.over_budget():
      return Observation(f"error: {why}; submit", "budget")
    if not isinstance(arguments, str):
      return Observation(
        f"error: arguments of {name} must be a JSON text, got {type(arguments).__name__}",
        "bad_arguments",
      )
    try:
      args = json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError) as e:
      return Observation(f"error: arguments of {name} are not JSON: {e}", "bad_arguments")
    spec = TOOLS[TOOL_NAMES.index(name)]["function"]["parameters"]
    if why := _check_args(args, spec):
      return Observation(f"error: bad arguments for {name}: {why}", "bad_arguments")
    args = {k: v for k, v in args.items() if v is not None}  # an optional null = absent
    try:
      return getattr(self, "_" + name)(turn, **args)
    except bwrap.SandboxUnavailable:
      raise  # the machine, not the model: no episode can go on
    except Exception as e:  # a tool bug must not stop the batch; it is logged and shown
      logging.warning("tool %s failed on %r: %s: %s", name, arguments[:200], type(e).__name__, e)
      return Observation(f"error: {name} failed: {type(e).__name__}", "failed")

  def _event(self, turn: int, **event) -> None:
    self.events.append({**event, "turn": turn})

  def _path(self, turn: int, path: str, kind: str) -> tuple[str | None, Observation | None]:
    rel = rel_path(path)
    # The monitor sees every path the agent asked for, outside ones included.
    self._event(turn, type=kind, path=posixpath.join(WORKSPACE, rel) if rel else path)
    if rel is None:
      return None, Observation(f"error: {path!r} is outside the workspace {WORKSPACE}", "outside")
    return rel, None

  def _out(self, text: str, error: str = "") -> Observation:
    return Observation(truncate(text, self.budget.output_chars), error)

  # -- file tools ----------------------------------------------------------------------------
  def _list_dir(self, turn, path="."):
    rel, bad = self._path(turn, path, "read")
    if bad:
      return bad
    prefix = "" if rel == "." else rel + "/"
    entries = set()
    for f in self.files:
      if f.startswith(prefix):
        head, sep, _ = f[len(prefix) :].partition("/")
        entries.add(head + "/" if sep else head)
    if not entries:
      return Observation(f"error: no directory {path!r}", "not_found")
    return self._out("\n".join(sorted(entries)))

  def _read_file(self, turn, path, start_line=1, end_line=None):
    rel, bad = self._path(turn, path, "read")
    if bad:
      return bad
    if rel not in self.files:
      return Observation(f"error: no file {path!r}", "not_found")
    lines = self.files[rel].decode("utf-8", "replace").splitlines()
    start, end = max(1, start_line), min(len(lines), end_line or len(lines))
    body = "\n".join(f"{i:>5}  {lines[i - 1]}" for i in range(start, end + 1))
    return self._out(body or f"({rel}: {len(lines)} lines, none in {start_line}..{end_line})")

  def _edit(self, turn, path, old_text, new_text):
    rel, bad = self._path(turn, path, "write")
    if bad:
      return bad
    if rel not in self.files:
      return Observation(f"error: no file {path!r}", "not_found")
    text = self.files[rel].decode("utf-8", "replace")
    n = text.count(old_text) if old_text else 0
    if n != 1:
      kind = "no_match" if n == 0 else "ambiguous"
      return Observation(f"error: old_text found {n} times in {rel}; it must match once", kind)
    return self._store(rel, text.replace(old_text, new_text, 1).encode(), f"edited {rel}")

  def _append(self, turn, path, code):
    rel, bad = self._path(turn, path, "write")
    if bad:
      return bad
    if rel not in self.files:
      return Observation(f"error: no file {path!r}", "not_found")
    text = self.files[rel].decode("utf-8", "replace").rstrip("\n")
    data = f"{text}\n\n\n{code.strip(chr(10))}\n".lstrip("\n").encode()
    return self._store(rel, data, f"appended to {rel}")

  def _write_file(self, turn, path, content):
    rel, bad = self._path(turn, path, "write")
    if bad:
      return bad
    if rel == "." or any(f.startswith(rel + "/") for f in self.files):
      return Observation(f"error: {path!r} is a directory", "not_found")
    parents = ["/".join(rel.split("/")[:i]) for i in range(1, rel.count("/") + 1)]
    if file := next((p for p in parents if p in self.files), None):
      return Observation(f"error: {file!r} is a file, not a directory", "not_found")
    return self._store(rel, content.encode(), f"wrote {rel} ({len(content)} characters)")

  def _store(self, rel: str, data: bytes, done: str) -> Observation:
    if len(data) > MAX_FILE_BYTES:
      return Observation(
        f"error: {rel} would be {len(data)} bytes; files are limited to {MAX_FILE_BYTES}",
        "bad_arguments",
      )
    self.files[rel] = data
    return Observation(done)

  # -- sandboxed tools -----------------------------------------------------------------------
  def _search(self, turn, pattern, path="."):
    rel, bad = self._path(turn, path, "read")
    if bad:
      return bad
    cmd = f"grep -rnIE --exclude-dir=.git -e {shlex.quote(pattern)} -- {shlex.quote(rel)}"
    obs = self._sandboxed(cmd)
    if obs.error == "failed" and not obs.text.split("\n", 1)[-1].strip():
      return Observation(f"no match for {pattern!r} under {rel}")
    return obs

  def _run(self, turn, command=None, tests=None):
    if (command is None) == (tests is None):
      return Observation(
        "error: bad arguments for run: give either command or tests", "bad_arguments"
      )
    if tests is not None:
      for t in tests:
        if t.startswith("-"):
          return Observation(f"error: {t!r} is not a test path", "bad_arguments")
        if rel_path(t.split("::")[0]) is None:
          return Observation(f"error: {t!r} is outside the workspace {WORKSPACE}", "outside")
      command = " ".join(["python -m pytest -q -p no:cacheprovider", *map(shlex.quote, tests)])
    self._event(turn, type="command", command=command)
    return self._sandboxed(command)

  def _submit(self, turn):
    self.submitted = True
    return Observation("submitted")

  def _sandboxed(self, command: str) -> Observation:
    """`sh -c command` in the sandbox on a copy of the workspace, pytest importable."""
    py = os.path.dirname(bwrap.real_python())
    env = [
      f"PATH={py}:/usr/bin:/bin",
      "PYTHONPATH=" + ":".join([suite.SITE, *suite.import_paths()]),
    ]
    limits = self.budget.command
    with bwrap.scratch("agentws") as tmp:
      write_tree(Path(tmp), self.files)
      res = bwrap.run(
        ["/usr/bin/env", *env, "/bin/sh", "-c", command],
        workspace=Path(tmp),
        ro=suite.runtime_binds(),
        limits=limits,
      )
    if res.timed_out:
      return self._out(f"error: command timed out after {limits.wall_s:g} s\n{res.log}", "timeout")
    if res.error:
      return self._out(f"error: {res.error}\n{res.log}", "failed")
    error = "" if res.returncode == 0 else "failed"
    log = _DURATION.sub(r"\1\2", res.log)
    return self._out(f"exit status {res.returncode}\n{log}", error)

  # -- the result ----------------------------------------------------------------------------
  def diff(self) -> str:
    """The workspace change as a `git apply`-able diff (.git excluded): what is graded."""
    keep = lambda files: {
      r: d.decode("utf-8", "surrogateescape") for r, d in files.items() if r.split("/")[0] != ".git"
    }
    return unified_diff(keep(self.base), keep(self.files))


def write_tree(root: Path, files: Mapping[str, bytes]) -> None:
  """Writes path -> bytes under root (directories made as needed)."""
  for rel, data in files.items():
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(data)


def _check_args(args, spec: dict) -> str:
  """'' if `args` is an object of the declared parameters with usable values, else why."""
  if not isinstance(args, dict):
    return f"expected a JSON object, got {type(args).__name__}"
  props = spec["properties"]
  if unknown := sorted(set(args) - set(props)):
    return f"unknown parameters {[u[:40] for u in unknown][:5]}; valid: {sorted(props)}"
  if missing := [k for k in spec["required"] if args.get(k) is None]:
    return f"missing parameters {missing}"
  types = {"string": str, "integer": int, "array": list}
  for k, v in args.items():
    if v is None:  # optional and absent
      continue
    want = props[k]["type"]
    items = v if want == "array" else [v]
    ok = isinstance(v, types[want]) and not isinstance(v, bool)
    if want == "array":
      ok = ok and all(isinstance(x, str) for x in v) and len(v) <= 1000
    if not ok:
      article = "an" if want[0] in "aei" else "a"
      return f"{k} must be {article} {want}, got {json.dumps(v)[:40]}"
    for x in items:
      if isinstance(x, str) and (why := _bad_text(k, x)):
        return why
  return ""


def _bad_text(key: str, text: str) -> str:
  """'' if `text` is usable as the value of parameter `key`, else why not."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    return f"{key} is not valid Unicode (a lone surrogate at {e.start})"
  limit = _MAX_STR.get(key)
  if limit is not None:
    if "\0" in text:
      return f"{key} contains a NUL character"
    if len(text) > limit:
      return f"{key} is {len(text)} characters long; at most {limit}"
  return ""
