"""The multi-turn episode runner: a batch of episodes played in lockstep, token-in/token-out.

Each round, every unfinished episode's history (the concatenation of its turns' ids, exactly as
sampled or received) is the prompt; one batched policy call samples the next model turn of all
episodes; the environment replies. Sampled ids and their log-probs are stored as they came out of
the sampler and are never re-tokenized, so the trainer scores exactly the tokens the policy
produced (`trajectory.Trajectory`).

An environment provides
    reset(task) -> (state, first_turn_ids)
    step(state, model_turn_ids) -> (state, reply_ids)   # [] when nothing is said back
    reward(state) -> float
and its state has a `done` attribute. An environment whose steps are slow (sandboxed commands,
grading) may also provide
    step_many(states, model_turn_ids) -> [(state, reply_ids), ...]
which must equal `step` on each pair; the runner then steps all live episodes of a round in one
call, so the environment can run them concurrently. The policy is
    policy(prompts [B, P] int32, prompt_lens [B] int32, key) ->
        (tokens [B, N] int32, logprobs [B, N] float32, lengths [B] int32)
(e.g. `functools.partial(decode.sample, ...)`); the first lengths[b] tokens of row b are the turn,
stop token included. Finished episodes still fill their row (static shapes); their output is
dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from composer_jax.rl.trajectory import Trajectory, Turn


@dataclasses.dataclass(frozen=True)
class Episode:
  """One finished episode: its trajectory, the environment's final state, its task."""

  trajectory: Trajectory
  state: Any
  task: Any


def _prompts(histories: Sequence[np.ndarray], prompt_len: int, pad_id: int):
  longest = max(len(h) for h in histories)
  if longest > prompt_len:
    raise ValueError(
      f"an episode history has {longest} tokens > prompt_len {prompt_len}; raise prompt_len or "
      "lower the environment's turn budget"
    )
  prompts = np.full((len(histories), prompt_len), pad_id, np.int32)
  for b, h in enumerate(histories):
    prompts[b, : len(h)] = h
  return prompts, np.array([len(h) for h in histories], np.int32)


def run_episodes(
  env,
  tasks: Sequence[Any],
  group_ids: Sequence[int],
  policy: Callable,
  key: jax.Array,
  *,
  prompt_len: int,
  pad_id: int = 0,
) -> list[Episode]:
  """Plays one episode per task; episode b belongs to GRPO group `group_ids[b]`.

  Deterministic given `key` (and a deterministic policy for a fixed key): round r samples with
  `fold_in(key, r)`.
  """
  if not tasks:
    raise ValueError("run_episodes needs at least one task")
  if len(group_ids) != len(tasks):
    raise ValueError(f"{len(group_ids)} group ids for {len(tasks)} tasks")
  states, turns = [], []
  for task in tasks:
    state, first = env.reset(task)
    states.append(state)
    turns.append([Turn(first)])
  round_ = 0
  while not all(s.done for s in states):
    histories = [np.concatenate([t.tokens for t in ts]).astype(np.int32) for ts in turns]
    prompts, lens = _prompts(histories, prompt_len, pad_id)
    out = policy(prompts, lens, jax.random.fold_in(key, round_))
    tokens, logprobs, lengths = (np.asarray(x) for x in out)
    live = [b for b, state in enumerate(states) if not state.done]
    for b in live:
      n = int(lengths[b])
      if n < 1:
        raise ValueError(f"the policy returned an empty turn for episode {b} in round {round_}")
      turns[b].append(Turn(tokens[b, :n].tolist(), logprobs[b, :n].tolist()))
    model_turns = [tokens[b, : int(lengths[b])] for b in live]
    if hasattr(env, "step_many"):
      stepped = env.step_many([states[b] for b in live], model_turns)
    else:
      stepped = [env.step(states[b], t) for b, t in zip(live, model_turns)]
    for b, (state, reply) in zip(live, stepped, strict=True):
      states[b] = state
      if reply:
        turns[b].append(Turn(reply))
    round_ += 1
  return [
    Episode(Trajectory.from_turns(ts, env.reward(s), g), s, task)
    for ts, s, g, task in zip(turns, states, group_ids, tasks, strict=True)
  ]
