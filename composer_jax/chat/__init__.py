"""Kimi K2 chat and tool-call format: messages -> token ids with per-token roles and a
trainable mask (`render.py`), and a parser for model output that never raises (`parse.py`).

The format is the released Kimi K2 / K2.5 chat template (third_party/README.md):

  <|im_system|>tool_declare<|im_middle|>[tools as JSON]<|im_end|>
  <|im_system|>system<|im_middle|>...<|im_end|>
  <|im_user|>user<|im_middle|>...<|im_end|>
  <|im_assistant|>assistant<|im_middle|><think>...</think>content
    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
    <|tool_call_argument_begin|>{json}<|tool_call_end|>...<|tool_calls_section_end|><|im_end|>
  <|im_system|>tool<|im_middle|>## Return of functions.NAME:IDX\n...<|im_end|>
"""

from composer_jax.chat.messages import Message, ToolCall, function_tool
from composer_jax.chat.parse import ParsedAssistant, parse_assistant
from composer_jax.chat.render import (
  ROLES,
  Rendered,
  render_conversation,
  render_generation_prompt,
  render_message,
  render_prefix,
)

__all__ = [
  "ROLES",
  "Message",
  "ParsedAssistant",
  "Rendered",
  "ToolCall",
  "function_tool",
  "parse_assistant",
  "render_conversation",
  "render_generation_prompt",
  "render_message",
  "render_prefix",
]
