"""Targeted text feedback: the faulty model turns of an episode and a hint for each.

A feedback kind is a function `(env, episode) -> [(turn index, hint ids), ...]`. Each
environment keeps a registry of its kinds (name -> a factory taking the kind's options, e.g.
`envs.toolcall.feedback.FEEDBACK_KINDS`), so a new kind (a style rule, a banned phrase) plugs in by
adding one entry. `make_feedback` builds the kinds a config names; `flag_turns` runs them over
one episode (what `Env.feedback` returns to the RL run); when several kinds flag the same
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


def make_feedback(
  registry: dict[str, Callable[..., Feedback]],
  kinds: Sequence[str],
  options: dict[str, dict] | None = None,
) -> list[Feedback]:
  """Builds the named kinds of an environment's `registry`; `options[name]` are keyword
  arguments of that kind's factory."""
  options = options or {}
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
