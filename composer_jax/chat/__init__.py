"""Kimi K2.5 chat and tool-call format: messages -> token ids with per-token roles and a
trainable mask (`render.py`), and a parser for model output that never raises (`parse.py`).

The format is the released Kimi K2.5 chat template (third_party/README.md); `<think>` and
`</think>` are single special tokens:

  <|im_system|>tool_declare<|im_middle|># Tools ... namespace functions {...}<|im_end|>
  <|im_system|>system<|im_middle|>...<|im_end|>
  <|im_user|>user<|im_middle|>...<|im_end|>
  <|im_assistant|>assistant<|im_middle|><think>...</think>content
    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
    <|tool_call_argument_begin|>{json}<|tool_call_end|>...<|tool_calls_section_end|><|im_end|>
  <|im_system|>tool<|im_middle|>## Return of functions.NAME:IDX\n...<|im_end|>
  <|im_assistant|>assistant<|im_middle|><think>      (generation prompt; instant: <think></think>)

Tool declarations are TypeScript-style (`tools_ts.py`).
"""

from composer_jax.chat.messages import Message, ToolCall, function_tool
from composer_jax.chat.parse import ParsedAssistant, parse_assistant
from composer_jax.chat.render import (
  ROLES,
  Rendered,
  prefill,
  render_conversation,
  render_generation_prompt,
  render_message,
  render_prefix,
)
from composer_jax.chat.tools_ts import tools_ts

__all__ = [
  "ROLES",
  "Message",
  "ParsedAssistant",
  "Rendered",
  "ToolCall",
  "function_tool",
  "parse_assistant",
  "prefill",
  "render_conversation",
  "render_generation_prompt",
  "render_message",
  "render_prefix",
  "tools_ts",
]
