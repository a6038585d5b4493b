"""parse_assistant: render -> parse and parse -> render round trips (examples and
hypothesis properties), and malformed or adversarial output as one-line errors, never a raise."""

import dataclasses
import json
import string

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ml_collections import ConfigDict

from composer_jax.chat import (
  Message,
  ToolCall,
  parse_assistant,
  render_conversation,
  render_message,
)
from composer_jax.chat.parse import FORMAT_HINT, MAX_ARGUMENT_DEPTH
from composer_jax.data import tokenizer as tok_lib
from tests.chat.conftest import build_bpe

CALLS = (
  ToolCall("read_file", '{"path": "a.py"}', 0),
  ToolCall("edit", '{"old": "x", "new": "y — z"}', 1),
)
MESSAGES = [
  Message("user", "Fix it."),
  Message("assistant", "Looking.", think="Read, then edit.", tool_calls=CALLS),
  Message("tool", "x = 1", tool_call_id=CALLS[0].id),
  Message("tool", "ok", tool_call_id=CALLS[1].id),
  Message("assistant", "", think="", tool_calls=(ToolCall("submit", "{}", 2),)),
  Message("tool", "submitted", tool_call_id="functions.submit:2"),
  Message("assistant", "Done.\n\nAll tests pass.", think="Check\nthe output."),
]


@pytest.mark.parametrize("length", [len(MESSAGES) - 1, len(MESSAGES)])
def test_render_then_parse_gives_back_the_messages(chat_tokenizer, length):
  """Every assistant turn reads back as it was; with a final answer at the end, the template
  drops the reasoning of all turns up to it, so those read back with an empty think."""
  messages = MESSAGES[:length]
  final = messages[-1].role == "assistant" and not messages[-1].tool_calls
  r = render_conversation(chat_tokenizer, messages)
  for turn, message in enumerate(messages):
    at = np.flatnonzero(r.turns == turn)
    written = at[r.trainable[at]]
    if message.role != "assistant":
      assert written.size == 0
      continue
    parsed = parse_assistant(chat_tokenizer.decode(r.ids[written]))
    assert parsed.error is None
    assert parsed.to_message() == (dataclasses.replace(message, think="") if final else message)


def test_thinking_prefill_parses_after_prepending_it():
  assert parse_assistant("<think>" + "plan</think>answer<|im_end|>") == parse_assistant(
    "<think>plan</think>answer"
  )
  assert parse_assistant("<think>plan</think>answer").think == "plan"


OK_CALL = (
  '<|tool_call_begin|>functions.run:0<|tool_call_argument_begin|>{"cmd": "ls"}<|tool_call_end|>'
)
T = "<think></think>"


def _one_call(call_id="functions.run:0", arguments='{"cmd": "ls"}'):
  return (
    f"{T}<|tool_calls_section_begin|><|tool_call_begin|>{call_id}"
    f"<|tool_call_argument_begin|>{arguments}<|tool_call_end|><|tool_calls_section_end|>"
  )


def _nested(depth):
  """A JSON object `depth` levels deep: {"a": [[...]]}."""
  return '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


@pytest.mark.parametrize(
  "text, error, n_calls",
  [
    ("<think>never closed", "<think> is never closed", 0),
    (
      T + "hi<|tool_call_begin|>functions.run:0",
      "<|tool_call_begin|> outside a tool-calls section",
      0,
    ),
    (T + "<|tool_calls_section_begin|>" + OK_CALL, "<|tool_calls_section_end|> is missing", 1),
    (T + "<|tool_calls_section_begin|><|tool_calls_section_end|>", "empty tool-calls section", 0),
    (
      T + "<|tool_calls_section_begin|>" + OK_CALL + "junk<|tool_calls_section_end|>",
      "expected <|tool_call_begin|>, got 'junk'",
      1,
    ),
    (_one_call("run:0", "{}"), "id 'run:0' is not functions.NAME:INDEX", 0),
    (_one_call(arguments="{cmd: ls}"), "arguments are not valid JSON", 0),
    (_one_call(arguments="[1]"), "must be a JSON object, got list", 0),
    (
      T + "<|tool_calls_section_begin|><|tool_call_begin|>functions.run:0<|tool_call_end|>"
      "<|tool_calls_section_end|>",
      "needs <|tool_call_argument_begin|> then",
      0,
    ),
    (
      T + "<|tool_calls_section_begin|>" + OK_CALL + "<|tool_calls_section_end|>more text",
      "text after <|tool_calls_section_end|>",
      1,
    ),
    ("<think></think>done<|im_end|>extra", "text after <|im_end|>", 0),
    # A turn must open with its reasoning block (else it would not re-render as written).
    ("done", "the turn must open with <think>", 0),
    ("plan</think>answer", "prepend the pre-fill", 0),  # a `<think>` pre-fill left off
    # Adversarial sizes and ids: one line each, never an exception.
    (_one_call(arguments=_nested(100_000)), f"nest deeper than {MAX_ARGUMENT_DEPTH} levels", 0),
    (_one_call(arguments=_nested(MAX_ARGUMENT_DEPTH + 1)), "nest deeper than", 0),
    (_one_call(arguments='{"a": "' + "[" * 100_000 + '"}'), None, 1),  # brackets in a string
    (_one_call(arguments='{"n": ' + "7" * 5000 + "}"), "arguments are not valid JSON", 0),
    (_one_call("functions.run:" + "9" * 5000), "is not functions.NAME:INDEX", 0),
    (_one_call("functions.run:\u0663"), "is not functions.NAME:INDEX", 0),  # Arabic-Indic 3
    (_one_call("functions.run:\uff13"), "is not functions.NAME:INDEX", 0),  # fullwidth 3
    (_one_call("functions.run:03"), "is not functions.NAME:INDEX", 0),  # would re-render as :3
    (_one_call("functions.r\u00e9ad:0"), "is not functions.NAME:INDEX", 0),
    (_one_call("functions." + "r" * 65 + ":0"), "is not functions.NAME:INDEX", 0),
  ],
)
def test_malformed_output_is_an_error_not_a_raise(text, error, n_calls):
  parsed = parse_assistant(text)
  if error is None:
    assert parsed.error is None
  else:
    assert error in parsed.error
    assert "\n" not in parsed.error and len(parsed.error) < 400  # One line: an observation.
  assert len(parsed.tool_calls) == n_calls
  if n_calls and error:
    assert parsed.tool_calls[0] == ToolCall("run", '{"cmd": "ls"}', 0)


def test_nesting_limit_is_exact():
  assert parse_assistant(_one_call(arguments=_nested(MAX_ARGUMENT_DEPTH))).error is None
  assert (
    "nest deeper" in parse_assistant(_one_call(arguments=_nested(MAX_ARGUMENT_DEPTH + 1))).error
  )


def test_format_hint_names_every_token():
  for token in (
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "functions.NAME:INDEX",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
  ):
    assert token in FORMAT_HINT


# -- properties -------------------------------------------------------------------------------
_TOKENIZER = []


def _tokenizer(tmp_path_factory):
  if not _TOKENIZER:
    path = build_bpe(tmp_path_factory.mktemp("bpe") / "tiktoken.model")
    _TOKENIZER.append(tok_lib.load_tokenizer(ConfigDict({"tokenizer": path})))
  return _TOKENIZER[0]


def _written(tokenizer, message: Message) -> str:
  """The text of the tokens the policy writes for `message` (ends with <|im_end|>)."""
  r = render_message(tokenizer, message)
  return tokenizer.decode(r.ids[r.trainable])


_SPECIALS = [
  "<think>",
  "</think>",
  "<|tool_calls_section_begin|>",
  "<|tool_calls_section_end|>",
  "<|tool_call_begin|>",
  "<|tool_call_argument_begin|>",
  "<|tool_call_end|>",
  "<|im_end|>",
]
# Free text: anything but the format's markers (those are the structure), incl. non-ASCII.
_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30).filter(
  lambda t: not any(m in t for m in _SPECIALS)
)
_JSON = st.recursive(
  st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
  lambda inner: (
    st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
  ),
  max_leaves=10,
)
_CALLS = st.lists(
  st.builds(
    ToolCall,
    name=st.text(string.ascii_letters + string.digits + "_.-", min_size=1, max_size=64),
    arguments=st.builds(
      lambda v, ascii_, indent: json.dumps(v, ensure_ascii=ascii_, indent=indent),
      st.dictionaries(st.text(max_size=5), _JSON, max_size=3),
      st.booleans(),
      st.sampled_from([None, 0, 2]),
    ),
    index=st.integers(0, 10**9 - 1),
  ),
  max_size=3,
)
_MESSAGES = st.builds(
  lambda think, content, calls: Message("assistant", content, think, tuple(calls)),
  _TEXT,
  _TEXT,
  _CALLS,
)
_FAST = settings(
  max_examples=150,
  deadline=None,
  database=None,
  suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@_FAST
@given(message=_MESSAGES)
def test_property_parse_of_render_is_the_message(message, tmp_path_factory):
  parsed = parse_assistant(_written(_tokenizer(tmp_path_factory), message))
  assert parsed.error is None
  assert parsed.to_message() == message


# Text built from the format's pieces, valid and broken ids, JSON, and free text.
_PIECES = st.sampled_from(
  _SPECIALS
  + [
    "functions.f:1",
    "functions.f:0",
    "functions.f:01",
    "functions.f:\u0663",
    "functions.f\u00e9:2",
    "functions.f:" + "9" * 12,
    "{",
    "}",
    "[",
    "]",
    '"a"',
    ":",
    ",",
    "1",
    "x",
    " ",
    "\n",
    "é",
    '{"a": [1]}',
    "{}",
    "[" * 70,
    "]" * 70,
  ]
)
_IDS = st.sampled_from(
  [
    "functions.f:1",
    "functions.f:0",
    "functions.f:01",
    "functions.f:\u0663",
    "functions.f\u00e9:2",
    "functions.f:" + "9" * 12,
    "functions.a.b-c_d:7",
  ]
)
_ARGS = st.sampled_from(
  [
    "{}",
    '{"a": [1]}',
    "[1]",
    '{"a": ' + "[" * 70 + "]" * 70 + "}",
    "{",
    '{"a": "<|tool_call_begin|>"}',
    '{"a":\n 1}',
  ]
)
_CALL = st.builds(
  "<|tool_call_begin|>{}<|tool_call_argument_begin|>{}<|tool_call_end|>".format, _IDS, _ARGS
)
_SECTION = st.lists(_CALL, max_size=3).map(
  lambda calls: "<|tool_calls_section_begin|>" + "".join(calls) + "<|tool_calls_section_end|>"
)
_SOUP = st.tuples(
  st.sampled_from(["", "<think>", "<think></think>"]),
  st.lists(_PIECES | _TEXT | _CALL | _SECTION, max_size=16).map("".join),
  st.sampled_from(["", "<|im_end|>"]),
).map("".join)
# Turns shaped like the format, with good and bad ids and arguments in their calls.
_SHAPED = st.tuples(
  st.just("<think>"),
  _TEXT,
  st.just("</think>"),
  _TEXT,
  st.sampled_from(["", "x"]) | _SECTION,
  st.sampled_from(["", "<|im_end|>"]),
).map("".join)


@_FAST
@given(text=_SOUP | _SHAPED | _MESSAGES | st.text(max_size=40))
def test_property_any_text_parses_to_one_line_or_renders_back_exactly(text, tmp_path_factory):
  """Never raises; an error is one line; accepted text re-renders to exactly what was written
  (the parser's <|im_end|> is optional; rendering always writes it)."""
  tokenizer = _tokenizer(tmp_path_factory)
  if isinstance(text, Message):
    text = _written(tokenizer, text)
  parsed = parse_assistant(text)
  if parsed.error is not None:
    assert isinstance(parsed.error, str) and "\n" not in parsed.error
    return
  expected = text if text.endswith("<|im_end|>") else text + "<|im_end|>"
  assert _written(tokenizer, parsed.to_message()) == expected


def test_message_validation_is_one_clear_line():
  with pytest.raises(ValueError, match="needs tool_call_id"):
    Message("tool", "out")
  with pytest.raises(ValueError, match="'robot' is not one of"):
    Message("robot", "hi")
