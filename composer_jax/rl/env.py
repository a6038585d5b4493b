"""The environment protocol of RL runs: token-in, token-out episodes with text feedback.

An RL run (`rl.steps`) needs from an environment only what is below; environments are
plug-ins (e.g. `composer_jax.envs.toolcall.ToolEnv`) that implement `Env` and are chosen by the
experiment, never imported by `rl/`. Messages are token ids in both directions, exactly
as sampled or sent, never re-tokenized (`rl.trajectory`).

    sample_task(rng) -> task                  a task drawn from a numpy Generator
    reset(task) -> (state, first_turn_ids)    the episode's first (system/user) turn
    step(state, model_turn_ids) -> (state, reply_ids)   [] once nothing is said back
    reward(state) -> float                    the episode's task reward
    feedback(episode) -> [(turn index, hint ids), ...]
        per-turn feedback flags: the faulty model turns of a finished episode and, for each,
        the hint that the self-distillation teacher reads before that turn
        (an env builds them from its registry of feedback kinds: `rl.feedback`)
    episode_metrics(episodes) -> {name: float}   episode metadata logged per RL step
    pad_id, stop_ids                          padding id; the ids that end a model turn
    step_many(states, model_turn_ids)         optional: `step` of many episodes at once (e.g.
                                              concurrently on workers; `rl.episodes`)
    state_dict() / load_state_dict(d)         optional: JSON-able state of the env itself that
                                              checkpoints keep (e.g. a curriculum; `rl.run`)
    probe_set(rng, count, *, seq_len, teacher_seq_len, turn_len)
                                              optional: `count` held-out flagged contexts
                                              (`rl.sd_probes.build_probe_set`), for `rl.probe_count`

Episode states have a `done` attribute.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from composer_jax.rl.episodes import Episode
from composer_jax.rl.teacher import DistillTarget


@runtime_checkable
class Env(Protocol):
  """What an RL run needs of an environment (see the module docstring)."""

  pad_id: int
  stop_ids: tuple[int, ...]

  def sample_task(self, rng: np.random.Generator) -> Any: ...

  def reset(self, task: Any) -> tuple[Any, list[int]]: ...

  def step(self, state: Any, tokens: Sequence[int]) -> tuple[Any, list[int]]: ...

  def reward(self, state: Any) -> float: ...

  def feedback(self, episode: Episode) -> list[tuple[int, list[int]]]: ...

  def episode_metrics(self, episodes: Sequence[Episode]) -> dict[str, float]: ...


def distill_targets(env: Env, episodes: Sequence[Episode]) -> list[DistillTarget]:
  """One `DistillTarget` per flagged (episode, turn); `trajectory_index` = position in
  `episodes` (= the episode's row of the packed batch)."""
  return [
    DistillTarget(i, k, tuple(hint))
    for i, episode in enumerate(episodes)
    for k, hint in sorted(env.feedback(episode), key=lambda f: f[0])
  ]
