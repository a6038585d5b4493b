"""Chat messages and tool calls as plain data (the fields Kimi K2's chat template reads)."""

import dataclasses
from collections.abc import Mapping
from typing import Any

MESSAGE_ROLES = ("system", "user", "assistant", "tool")


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One call as the model writes it: `functions.NAME:INDEX` then the raw JSON arguments.

  `arguments` is kept as the exact text emitted (never re-serialized), so rendering a parsed
  call gives back the sampled tokens. `index` is K2's call counter (the `IDX` of the id).
  """

  name: str
  arguments: str
  index: int

  @property
  def id(self) -> str:
    """K2's tool-call id, which the tool's reply quotes (`## Return of <id>`)."""
    return f"functions.{self.name}:{self.index}"


@dataclasses.dataclass(frozen=True)
class Message:
  """A chat message.

  Attributes:
    role: 'system', 'user', 'assistant' or 'tool'.
    content: the text (may be empty).
    think: the assistant's reasoning (the `<think>` section); rendered only for assistant
      messages after the last assistant message without tool calls, as the template does.
    tool_calls: an assistant's calls, in order.
    tool_call_id: for a tool message, the id of the call it answers (`ToolCall.id`).
    name: overrides the role name written after the role token (the template's `name`).
  """

  role: str
  content: str = ""
  think: str = ""
  tool_calls: tuple[ToolCall, ...] = ()
  tool_call_id: str = ""
  name: str = ""

  def __post_init__(self):
    if self.role not in MESSAGE_ROLES:
      raise ValueError(f"message role {self.role!r} is not one of {MESSAGE_ROLES}")
    if self.role == "tool" and not self.tool_call_id:
      raise ValueError("a tool message needs tool_call_id (the ToolCall.id it answers)")
    if self.role != "assistant" and (self.think or self.tool_calls):
      raise ValueError(f"only assistant messages carry think/tool_calls, not {self.role!r}")
    object.__setattr__(self, "tool_calls", tuple(self.tool_calls))


def function_tool(name: str, description: str, parameters: Mapping[str, Any]) -> dict:
  """An OpenAI-style tool declaration, the list element the template's `tools` expects."""
  return {
    "type": "function",
    "function": {"name": name, "description": description, "parameters": dict(parameters)},
  }
