"""Feedback kinds for coding behaviour: the faulty model turns of an episode and their hints.

Each kind is a factory (its options as keyword arguments) returning
`feedback(env, episode) -> [(turn index, hint ids), ...]`; `FEEDBACK_KINDS` finds them by name
(`rl.feedback.make_feedback(FEEDBACK_KINDS, ...)`), `flag_turns` merges
them per turn. They read the episode's records (`agent_env.CodingState`: per model turn its
text, parse error and calls with their observations and file changes; the monitor's flags
with their turns) and write the hint as text, rendered by `env.hint`.

  unavailable_tool  a call to a tool not on offer; hint: the available tools
  malformed_call    a turn that does not parse, or a call whose arguments are rejected;
                    hint: the tool-call format
  style             a turn whose edits / write_files of a .py file add ruff violations (only
                    those the turn introduced: per (rule, message), the file after the turn's
                    last change minus before its first); hint: the rules
  overlong_message  a turn over `max_tokens` tokens
  tests_or_outside  a turn the monitor flags for touching tests / runner config or paths outside
                    the workspace (`test_tamper`, `outside_workspace`)
  effort            submitting (or stopping) without having run anything; running the same
                    failing command `repeats` times (flagged from the `repeats`-th on)
"""

from __future__ import annotations

import collections
import functools
import json
import subprocess
from collections.abc import Callable

from composer_jax.chat.parse import FORMAT_HINT
from composer_jax.envs.coding.agent import tools as agent_tools
from composer_jax.rl.feedback import Feedback


def _records(episode):
  return episode.state.records


def unavailable_tool() -> Feedback:
  """Flags turns that call a tool not on offer; the hint lists the available tools."""

  def feedback(env, episode):
    out = []
    for r in _records(episode):
      bad = [c.name for c in r.calls if c.observation and c.observation.error == "unknown_tool"]
      if bad:
        text = (
          f"reminder: {', '.join(bad)} is not available; available tools: {', '.join(env.tools)}"
        )
        out.append((r.index, env.hint(text)))
    return out

  return feedback


def malformed_call() -> Feedback:
  """Flags turns that do not parse as the chat format, or whose call arguments are rejected;
  the hint gives the format."""

  def feedback(env, episode):
    out = []
    for r in _records(episode):
      bad_args = [c for c in r.calls if c.observation and c.observation.error == "bad_arguments"]
      if r.parse_error is not None or bad_args:
        why = r.parse_error or bad_args[0].observation.text
        out.append((r.index, env.hint(f"reminder: {FORMAT_HINT}. ({why})")))
    return out

  return feedback


@functools.cache
def _ruff() -> str:
  from ruff.__main__ import find_ruff_bin  # the ruff wheel ships its binary

  return str(find_ruff_bin())


def ruff_violations(text: str, path: str, select: tuple[str, ...] = ()) -> list[tuple[str, str]]:
  """(rule code, message) of each ruff violation in `text` (as file `path`), isolated from
  any project config; `select`: rule codes/prefixes, () for ruff's defaults."""
  cmd = [_ruff(), "check", "--isolated", "--no-cache", "--output-format", "json"]
  cmd += [f"--select={','.join(select)}"] if select else []
  res = subprocess.run(
    [*cmd, "--stdin-filename", path, "-"], input=text, capture_output=True, text=True, timeout=60
  )
  if res.returncode not in (0, 1):
    raise RuntimeError(f"ruff failed on {path}: {res.stderr.strip()[:200]}")
  return [(v["code"] or "E999", v["message"]) for v in json.loads(res.stdout or "[]")]


def added_violations(record, select: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
  """(path, rule code, message) of each ruff violation a model turn's edits / write_files of
  .py files add: per file, the text after the turn's last change minus before its first (so a
  violation that a later edit of the same turn removes does not count)."""
  spans: dict[str, list] = {}  # path -> [text before the turn's first change, after its last]
  for c in record.calls:
    if c.change is not None and c.change[0].endswith(".py"):
      spans.setdefault(c.change[0], [c.change[1], None])[1] = c.change[2]
  new = []
  for path, (before, after) in sorted(spans.items()):
    old = collections.Counter(ruff_violations(before, path, select) if before else [])
    added = collections.Counter(ruff_violations(after, path, select)) - old
    new += [(path, code, msg) for code, msg in sorted(added.elements())]
  return new


def style(select: tuple[str, ...] = ()) -> Feedback:
  """Flags edits of .py files that add ruff violations (`select`: ruff rules, () = ruff's
  defaults); the hint names each new rule and its message."""
  select = tuple(select)

  def feedback(env, episode):
    out = []
    for r in _records(episode):
      new = list(
        dict.fromkeys(f"{p}: {code} {msg}" for p, code, msg in added_violations(r, select))
      )
      if new:
        text = "reminder: your edit adds style violations (ruff): " + "; ".join(new)
        out.append((r.index, env.hint(text)))
    return out

  return feedback


def overlong_message(max_tokens: int = 2048) -> Feedback:
  """Flags model turns longer than `max_tokens` tokens."""
  if max_tokens < 1:
    raise ValueError(f"max_tokens={max_tokens} must be >= 1")

  def feedback(env, episode):
    hint = env.hint(f"reminder: keep each message under {max_tokens} tokens")
    return [(r.index, hint) for r in _records(episode) if r.tokens > max_tokens]

  return feedback


def tests_or_outside(rules: tuple[str, ...] = ("test_tamper", "outside_workspace")) -> Feedback:
  """Flags turns whose tool calls the monitor flags under `rules` (tests, runner config, paths
  outside the workspace); the hint names what was touched."""

  def feedback(env, episode):
    reasons: dict[int, list[str]] = {}
    for f in episode.state.flags:
      if f["kind"] in rules and f.get("turn") is not None:
        reasons.setdefault(f["turn"], []).append(f["reason"])
    return [
      (
        k,
        env.hint(
          f"reminder: do not modify tests or test configuration and stay inside "
          f"{agent_tools.WORKSPACE} ({'; '.join(sorted(set(why)))})"
        ),
      )
      for k, why in sorted(reasons.items())
    ]

  return feedback


def effort(repeats: int = 3) -> Feedback:
  """Flags the final turn of an episode that submits (or stops calling tools) without having
  run any command, and each run of a failing command already run and failed `repeats - 1`
  times with the same arguments."""
  if repeats < 2:
    raise ValueError(f"repeats={repeats} must be >= 2")

  def feedback(env, episode):
    out, ran, failures = [], False, collections.Counter()
    for r in _records(episode):
      ends = r is _records(episode)[-1] and episode.state.end in ("submit", "no_call")
      if ends and not ran and not any(c.name == "run" for c in r.calls):
        out.append((r.index, env.hint("reminder: run the tests before you submit")))
      for c in r.calls:
        if c.name != "run" or c.observation is None:
          continue
        ran = True
        if c.observation.error in ("failed", "timeout"):
          failures[c.arguments] += 1
          if failures[c.arguments] >= repeats:
            text = (
              f"reminder: this command failed {failures[c.arguments]} times the same way; read "
              "its output and change something before running it again"
            )
            out.append((r.index, env.hint(text)))
    return sorted(dict(out).items())

  return feedback


FEEDBACK_KINDS: dict[str, Callable[..., Feedback]] = {
  "unavailable_tool": unavailable_tool,
  "malformed_call": malformed_call,
  "style": style,
  "overlong_message": overlong_message,
  "tests_or_outside": tests_or_outside,
  "effort": effort,
}
