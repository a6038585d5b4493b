"""parse_assistant: render -> parse round trip, and malformed output as an error, never a raise."""

import dataclasses

import numpy as np
import pytest

from composer_jax.chat import Message, ToolCall, parse_assistant, render_conversation
from composer_jax.chat.parse import FORMAT_HINT

CALLS = (ToolCall("read_file", '{"path": "a.py"}', 0),
         ToolCall("edit", '{"old": "x", "new": "y — z"}', 1))
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
  assert parse_assistant("<think>" + "plan</think>answer<|im_end|>") == \
      parse_assistant("<think>plan</think>answer")
  assert parse_assistant("<think>plan</think>answer").think == "plan"


OK_CALL = '<|tool_call_begin|>functions.run:0<|tool_call_argument_begin|>{"cmd": "ls"}<|tool_call_end|>'


@pytest.mark.parametrize("text, error, n_calls", [
  ("<think>never closed", "<think> is never closed", 0),
  ("hi<|tool_call_begin|>functions.run:0", "<|tool_call_begin|> outside a tool-calls section", 0),
  ("<|tool_calls_section_begin|>" + OK_CALL, "<|tool_calls_section_end|> is missing", 1),
  ("<|tool_calls_section_begin|><|tool_calls_section_end|>", "empty tool-calls section", 0),
  ("<|tool_calls_section_begin|>" + OK_CALL + "junk<|tool_calls_section_end|>",
   "expected <|tool_call_begin|>, got 'junk'", 1),
  ("<|tool_calls_section_begin|><|tool_call_begin|>run:0<|tool_call_argument_begin|>{}"
   "<|tool_call_end|><|tool_calls_section_end|>", "id 'run:0' is not functions.NAME:INDEX", 0),
  ("<|tool_calls_section_begin|><|tool_call_begin|>functions.run:0<|tool_call_argument_begin|>"
   "{cmd: ls}<|tool_call_end|><|tool_calls_section_end|>", "arguments are not valid JSON", 0),
  ("<|tool_calls_section_begin|><|tool_call_begin|>functions.run:0<|tool_call_argument_begin|>"
   "[1]<|tool_call_end|><|tool_calls_section_end|>", "must be a JSON object, got list", 0),
  ("<|tool_calls_section_begin|><|tool_call_begin|>functions.run:0<|tool_call_end|>"
   "<|tool_calls_section_end|>", "needs <|tool_call_argument_begin|> then", 0),
  ("<|tool_calls_section_begin|>" + OK_CALL + "<|tool_calls_section_end|>more text",
   "text after <|tool_calls_section_end|>", 1),
  ("<think></think>done<|im_end|>extra", "text after <|im_end|>", 0),
])
def test_malformed_output_is_an_error_not_a_raise(text, error, n_calls):
  parsed = parse_assistant(text)
  assert error in parsed.error
  assert "\n" not in parsed.error  # One line: usable as an observation.
  assert len(parsed.tool_calls) == n_calls
  if n_calls:
    assert parsed.tool_calls[0] == ToolCall("run", '{"cmd": "ls"}', 0)


def test_format_hint_names_every_token():
  for token in ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.NAME:INDEX",
                "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|tool_calls_section_end|>"):
    assert token in FORMAT_HINT


def test_arbitrary_text_never_raises():
  rng = np.random.default_rng(0)
  alphabet = ["<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
              "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
              "<|im_end|>", "functions.f:1", "{", "}", '"a"', ":", "x", " "]
  for _ in range(2000):
    text = "".join(rng.choice(alphabet, size=rng.integers(0, 12)))
    parsed = parse_assistant(text)
    assert parsed.error is None or isinstance(parsed.error, str)


def test_message_validation_is_one_clear_line():
  with pytest.raises(ValueError, match="needs tool_call_id"):
    Message("tool", "out")
  with pytest.raises(ValueError, match="'robot' is not one of"):
    Message("robot", "hi")
