"""Parses an assistant turn as the model wrote it; never raises on malformed output.

The input is the assistant body as the template renders it (`<think>...</think>content`,
then an optional tool-calls section, then an optional `<|im_end|>`), i.e. the sampled
tokens decoded with their special-token names kept, after any `<think>` pre-fill of the
generation prompt. A problem does not raise: `error` is one line naming it, fit to show
the model as an observation and to flag the turn for feedback, and the fields hold what
was readable (the calls well formed before the problem).

Accepted text round-trips: rendering the parsed message (`chat.render_message`) gives back
the text exactly (plus `<|im_end|>` if it was left off), so a tool reply quotes the call id
the model wrote. That is why a turn must open with `<think>` (the template always writes
the block; a missing one usually means a generation prompt's pre-fill was not prepended),
a call id is `functions.NAME:INDEX` with NAME of 1-64 ASCII letters, digits, `_`, `.` or
`-` and INDEX an ASCII decimal without leading zeros below 10^9 (`int` would read `٣` or
`03` as 3, which re-renders differently), and arguments are a JSON object nested at most
`MAX_ARGUMENT_DEPTH` deep (deeper JSON is refused in one line; Python's decoder would raise
RecursionError past about a thousand levels). Parsing takes time linear in the text.
"""

import dataclasses
import json
import re

from composer_jax.chat.messages import Message, ToolCall

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_end|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
END = "<|im_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_CALL_TOKENS = (CALL_BEGIN, ARG_BEGIN, CALL_END, SECTION_END)
_CALL_ID = re.compile(r"functions\.(?P<name>[A-Za-z0-9_.\-]{1,64}):(?P<index>0|[1-9][0-9]{0,8})")
MAX_ARGUMENT_DEPTH = 64
FORMAT_HINT = (
  f"write calls as {SECTION_BEGIN}{CALL_BEGIN}functions.NAME:INDEX{ARG_BEGIN}"
  f"{{JSON object}}{CALL_END}{SECTION_END}"
)
_ID_HINT = (
  "functions.NAME:INDEX (NAME: 1-64 ASCII letters, digits, _ . -; INDEX: a decimal "
  "number without leading zeros, below 10^9)"
)


@dataclasses.dataclass(frozen=True)
class ParsedAssistant:
  """An assistant turn read back: `error` is None when the turn was well formed."""

  content: str
  think: str
  tool_calls: tuple[ToolCall, ...]
  error: str | None = None

  def to_message(self) -> Message:
    return Message("assistant", self.content, self.think, self.tool_calls)


def parse_assistant(text: str) -> ParsedAssistant:
  """Reads `<think>THINK</think>CONTENT[tool-calls section][<|im_end|>]`; never raises."""
  body, error = text, None
  if body.endswith(END):
    body = body[: -len(END)]
  if END in body:
    body, error = body[: body.index(END)], f"text after {END}"

  if not body.startswith(THINK_OPEN):
    return ParsedAssistant(
      body,
      "",
      (),
      f"the turn must open with {THINK_OPEN} (its reasoning "
      f"block, empty allowed: {THINK_OPEN}{THINK_CLOSE}); with a "
      "pre-filled generation prompt, prepend the pre-fill",
    )
  close = body.find(THINK_CLOSE)
  if close < 0:
    return ParsedAssistant(
      "", body[len(THINK_OPEN) :], (), f"{THINK_OPEN} is never closed by {THINK_CLOSE}"
    )
  think, body = body[len(THINK_OPEN) : close], body[close + len(THINK_CLOSE) :]

  content, section = body, None
  if SECTION_BEGIN in body:
    at = body.index(SECTION_BEGIN)
    content, section = body[:at], body[at + len(SECTION_BEGIN) :]
  stray = next((t for t in _CALL_TOKENS if t in content), None)
  if stray:
    return ParsedAssistant(
      content,
      think,
      (),
      f"malformed tool call: {stray} outside a tool-calls section; {FORMAT_HINT}",
    )
  if section is None:
    return ParsedAssistant(content, think, (), error)
  calls, section_error = _parse_section(section)
  return ParsedAssistant(content, think, calls, section_error or error)


def _parse_section(section: str) -> tuple[tuple[ToolCall, ...], str | None]:
  """Calls of the text after SECTION_BEGIN, and the first problem (or None)."""
  if SECTION_END not in section:
    return _parse_calls(section, "")[
      0
    ], f"malformed tool call: {SECTION_END} is missing; " + FORMAT_HINT
  inner, after = section.split(SECTION_END, 1)
  return _parse_calls(inner, after)


def _parse_calls(inner: str, after: str) -> tuple[tuple[ToolCall, ...], str | None]:
  """The calls of a section's text `inner` (and what followed the section, `after`)."""
  calls, at = [], 0
  while at < len(inner):
    if not inner.startswith(CALL_BEGIN, at):
      return tuple(calls), (
        f"malformed tool call: expected {CALL_BEGIN}, got {inner[at : at + 40]!r}; " + FORMAT_HINT
      )
    at += len(CALL_BEGIN)
    arg, end = inner.find(ARG_BEGIN, at), inner.find(CALL_END, at)
    if arg < 0 or end < arg:
      return tuple(calls), (
        f"malformed tool call {len(calls)}: needs {ARG_BEGIN} then {CALL_END}; " + FORMAT_HINT
      )
    header, arguments, at = inner[at:arg], inner[arg + len(ARG_BEGIN) : end], end + len(CALL_END)
    match = _CALL_ID.fullmatch(header)
    if not match:
      return tuple(calls), f"malformed tool call {len(calls)}: id {header[:60]!r} is not {_ID_HINT}"
    error = _arguments_error(arguments)
    if error:
      return tuple(calls), f"malformed tool call {header}: {error}"
    calls.append(ToolCall(match["name"], arguments, int(match["index"])))
  if not calls:
    return (), "malformed tool call: empty tool-calls section; " + FORMAT_HINT
  if after:
    return tuple(calls), f"text after {SECTION_END}: {after[:40]!r}"
  return tuple(calls), None


def _arguments_error(arguments: str) -> str | None:
  """Why `arguments` is not a JSON object nested at most MAX_ARGUMENT_DEPTH deep, or None."""
  too_deep = f"arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels"
  try:
    value = json.loads(arguments)
  except RecursionError:
    return too_deep
  except ValueError as e:
    return f"arguments are not valid JSON ({e})"
  if not isinstance(value, dict):
    return f"arguments must be a JSON object, got {type(value).__name__}"
  level = [value]
  for _ in range(MAX_ARGUMENT_DEPTH):  # One pass per level, no recursion.
    level = [
      v
      for c in level
      for v in (c.values() if isinstance(c, dict) else c)
      if isinstance(v, (dict, list))
    ]
    if not level:
      return None
  return too_deep
