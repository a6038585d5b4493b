"""Targeted text feedback: find the faulty model turns of an episode and write a hint for each.

A feedback kind is a function `(env, episode) -> [(turn index, hint ids), ...]`. Kinds are looked
up by name in `FEEDBACK_KINDS` (a factory taking the kind's options), so a new kind (a style rule,
a banned phrase) plugs in by adding one entry. `flag_turns` runs the chosen kinds over one
episode (what `ToolEnv.feedback` returns to the RL program); when several kinds flag the same
turn, their hints are concatenated in the order the kinds were given, so each turn gets one
teacher row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from composer_jax.rl.episodes import Episode

Feedback = Callable[[object, Episode], list[tuple[int, list[int]]]]


def model_turns(episode: Episode) -> list[tuple[int, np.ndarray]]:
  """(turn index, sampled ids) of every model turn, in order."""
  traj = episode.trajectory
  out = []
  for k in range(traj.num_turns):
    if traj.is_model_turn(k):
      start, end = traj.turn_span(k)
      out.append((k, traj.tokens[start:end]))
  return out


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


def make_feedback(
  kinds: Sequence[str],
  options: dict[str, dict] | None = None,
  registry: dict[str, Callable[..., Feedback]] | None = None,
) -> list[Feedback]:
  """Builds the named kinds of `registry` (default: this env's `FEEDBACK_KINDS`; the coding env
  passes its own); `options[name]` are keyword arguments of that kind's factory."""
  options, registry = options or {}, FEEDBACK_KINDS if registry is None else registry
  unknown = [k for k in list(kinds) + list(options) if k not in registry]
  if unknown:
    raise ValueError(f"unknown feedback kinds {unknown}; valid: {sorted(registry)}")
  if not kinds:
    raise ValueError(f"give at least one feedback kind from {sorted(registry)}")
  return [registry[k](**options.get(k, {})) for k in kinds]


def flag_turns(feedbacks: Sequence[Feedback], env, episode: Episode) -> list[tuple[int, list[int]]]:
  """(turn index, hint ids) per flagged model turn of `episode`, in turn order."""
  hints: dict[int, list[int]] = {}
  for feedback in feedbacks:
    for k, hint in feedback(env, episode):
      hints.setdefault(k, []).extend(hint)
  return [(k, hints[k]) for k in sorted(hints)]
