"""Messages -> token ids, per-token role, trainable mask and turn, as Kimi K2.5's template.

The released template (third_party/README.md) is rebuilt piece by piece: special tokens
by id (the think tags `<think>` and `</think>` too: single tokens in K2.5's tokenizer), text
between them with the tokenizer's ordinary encoding. Because tiktoken splits text at special
tokens before BPE, this equals tokenizing the template's string with special tokens allowed
(tests/chat/golden_test.py checks it token for token), with one deliberate difference:
special-token names inside message text stay plain text, so a user or tool output cannot
forge a turn boundary. K2.5 over K2: tools are declared in TypeScript style (`tools_ts.py`),
and the generation prompt pre-fills `<think>` (thinking) or `<think></think>` (instant).

Trainable tokens are what the policy writes: an assistant message's body (think, content,
tool-call tokens) and its closing <|im_end|>; role headers, prompts and tool results are not.
"""

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from composer_jax.chat.messages import Message
from composer_jax.chat.tools_ts import tools_ts

# Per-token role codes (`Rendered.roles`); "tool_declare" is the tool-declaration turn.
ROLES = ("system", "user", "assistant", "tool", "tool_declare")
ROLE_CODE = {r: i for i, r in enumerate(ROLES)}
_ROLE_TOKEN = {"user": "<|im_user|>", "assistant": "<|im_assistant|>"}  # Others: <|im_system|>.
DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."
# Turn index of tokens outside any message (tool declarations, default system, prompt).
NO_TURN = -1


@dataclasses.dataclass(frozen=True)
class Rendered:
  """A rendered conversation: four aligned `[seq]` arrays.

  ids: int32 token ids. roles: int8 codes into `ROLES`. trainable: bool, True on tokens the
  policy wrote. turns: int32 index of the message each token belongs to, or NO_TURN.
  """

  ids: np.ndarray
  roles: np.ndarray
  trainable: np.ndarray
  turns: np.ndarray

  @staticmethod
  def concat(parts: Sequence["Rendered"]) -> "Rendered":
    if not parts:
      return _pieces_to_rendered([])
    return Rendered(
      *(np.concatenate([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(Rendered))
    )


def _special(tokenizer, name: str) -> int:
  specials = getattr(tokenizer, "special_tokens", None)
  if not specials or name not in specials:
    raise ValueError(
      f"tokenizer {type(tokenizer).__name__} has no special token {name!r}: the chat format "
      "needs a tiktoken file (Kimi's special-token table), not the byte tokenizer"
    )
  return specials[name]


class _Builder:
  """Accumulates (ids, role, trainable, turn) runs."""

  def __init__(self, tokenizer):
    self.tokenizer, self.pieces = tokenizer, []

  def special(self, name, role, trainable=False, turn=NO_TURN):
    self.pieces.append(([_special(self.tokenizer, name)], role, trainable, turn))

  def text(self, text, role, trainable=False, turn=NO_TURN):
    if text:
      self.pieces.append((self.tokenizer.encode(text), role, trainable, turn))

  def header(self, role_token, role_name, role, turn=NO_TURN):
    self.special(role_token, role, turn=turn)
    self.text(role_name, role, turn=turn)
    self.special("<|im_middle|>", role, turn=turn)

  def build(self) -> Rendered:
    return _pieces_to_rendered(self.pieces)


def _pieces_to_rendered(pieces) -> Rendered:
  lengths = [len(ids) for ids, *_ in pieces]
  return Rendered(
    ids=np.asarray([i for ids, *_ in pieces for i in ids], dtype=np.int32),
    roles=np.repeat(np.asarray([ROLE_CODE[r] for _, r, _, _ in pieces], np.int8), lengths),
    trainable=np.repeat(np.asarray([t for *_, t, _ in pieces], bool), lengths),
    turns=np.repeat(np.asarray([n for *_, n in pieces], np.int32), lengths),
  )


def render_prefix(
  tokenizer, tools: Sequence[Mapping] | None = None, add_default_system: bool = True
) -> Rendered:
  """The tool-declaration turn (if `tools`) and, if asked, the default system turn.

  Tools are written as K2.5's tokenizer writes them (`tools_ts_str`, `tools_ts.tools_ts`):
  TypeScript-style declarations of the key-sorted tools.
  """
  b = _Builder(tokenizer)
  if tools:
    b.header("<|im_system|>", "tool_declare", "tool_declare")
    b.text(tools_ts(tools), "tool_declare")
    b.special("<|im_end|>", "tool_declare")
  if add_default_system:
    b.header("<|im_system|>", "system", "system")
    b.text(DEFAULT_SYSTEM, "system")
    b.special("<|im_end|>", "system")
  return b.build()


def render_message(
  tokenizer, message: Message, turn: int = NO_TURN, keep_think: bool = True
) -> Rendered:
  """One message, `<|im_...|>role<|im_middle|>body<|im_end|>`.

  Args:
    tokenizer: a `TiktokenTokenizer` (it has Kimi's special tokens).
    message: the message.
    turn: the index written in `Rendered.turns` for its tokens.
    keep_think: write the assistant's reasoning; the template drops it (empty
      `<think></think>`) for assistant messages up to the last one without tool calls, and
      for every message in instant mode.
  """
  b, role = _Builder(tokenizer), message.role
  b.header(_ROLE_TOKEN.get(role, "<|im_system|>"), message.name or role, role, turn)
  if role == "assistant":
    b.special("<think>", role, True, turn)
    b.text(message.think if keep_think else "", role, True, turn)
    b.special("</think>", role, True, turn)
    b.text(message.content, role, True, turn)
    if message.tool_calls:
      b.special("<|tool_calls_section_begin|>", role, True, turn)
      for call in message.tool_calls:
        b.special("<|tool_call_begin|>", role, True, turn)
        b.text(call.id, role, True, turn)
        b.special("<|tool_call_argument_begin|>", role, True, turn)
        b.text(call.arguments, role, True, turn)
        b.special("<|tool_call_end|>", role, True, turn)
      b.special("<|tool_calls_section_end|>", role, True, turn)
  elif role == "tool":
    b.text(f"## Return of {message.tool_call_id}\n{message.content}", role, turn=turn)
  else:
    b.text(message.content, role, turn=turn)
  b.special("<|im_end|>", role, role == "assistant", turn)
  return b.build()


def prefill(thinking: bool = True) -> str:
  """The text K2.5's generation prompt pre-fills: `<think>` (thinking) or `<think></think>`
  (instant). Prepend it to the sampled text before `parse_assistant`."""
  return "<think>" if thinking else "<think></think>"


def render_generation_prompt(tokenizer, thinking: bool = True) -> Rendered:
  """`<|im_assistant|>assistant<|im_middle|>` + `prefill(thinking)`, the prompt the policy
  continues: K2.5's thinking (True, its default) or instant (False) mode."""
  b = _Builder(tokenizer)
  b.header("<|im_assistant|>", "assistant", "assistant")
  b.special("<think>", "assistant")
  if not thinking:
    b.special("</think>", "assistant")
  return b.build()


def render_conversation(
  tokenizer,
  messages: Sequence[Message],
  tools: Sequence[Mapping] | None = None,
  add_generation_prompt: bool = False,
  thinking: bool = True,
) -> Rendered:
  """A whole conversation, as Kimi K2.5's chat template renders it.

  The default system message is added when the first message is not a system message.
  Reasoning is kept only after the last assistant message without tool calls (earlier
  turns get `<think></think>`), so an agent episode whose assistant turns all call tools
  renders append-only: each turn's tokens never change as the episode grows. `thinking=False`
  (instant mode) drops every turn's reasoning and pre-fills `<think></think>`.
  """
  last_final = max(
    (i for i, m in enumerate(messages) if m.role == "assistant" and not m.tool_calls), default=-1
  )
  parts = [
    render_prefix(tokenizer, tools, add_default_system=not messages or messages[0].role != "system")
  ]
  parts += [
    render_message(tokenizer, m, turn=i, keep_think=thinking and i > last_final)
    for i, m in enumerate(messages)
  ]
  if add_generation_prompt:
    parts.append(render_generation_prompt(tokenizer, thinking))
  return Rendered.concat(parts)
