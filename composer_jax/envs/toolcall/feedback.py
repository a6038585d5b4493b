"""The tool environment's feedback kinds (`rl.feedback`): calls to tools not on offer, and
over-long messages; each flags model turns and writes the hint for them."""

from __future__ import annotations

from collections.abc import Callable

from composer_jax.rl.feedback import Feedback, model_turns


def unavailable_tool(all_tools: bool = False) -> Feedback:
  """Flags each `call TOOL` with TOOL not on offer; hint: 'reminder: available <tools>', the
  offered tools that serve TOOL's capability (`ToolEnv.hint`), or all of them if `all_tools`."""

  def feedback(env, episode):
    out = []
    for k, ids in model_turns(episode):
      kind, tool = env.parse(ids)
      if kind == "call" and tool not in episode.task.available:
        out.append((k, env.hint(episode.task, None if all_tools else tool)))
    return out

  return feedback


SHORT_HINT = "reminder: keep messages short <eot>"


def overlong_message(max_tokens: int = 3) -> Feedback:
  """Flags model turns longer than `max_tokens`; hint: `SHORT_HINT`."""
  if max_tokens < 1:
    raise ValueError(f"max_tokens={max_tokens} must be >= 1")

  def feedback(env, episode):
    hint = env.vocab.encode(SHORT_HINT)
    return [(k, hint) for k, ids in model_turns(episode) if len(ids) > max_tokens]

  return feedback


FEEDBACK_KINDS: dict[str, Callable[..., Feedback]] = {
  "unavailable_tool": unavailable_tool,
  "overlong_message": overlong_message,
}
