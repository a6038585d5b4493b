"""A one-turn `rl.env.Env` for RL tests: rewards that vary under a random-init policy.

Task t in [4, 12): the first turn is [1, t, 2]; the model answers once (up to
`rl.max_new_tokens` tokens, ending at the stop id 3); reward = the share of the answer's tokens
with t's parity. A turn with reward < 1 is flagged, with the hint [t, t]. Random weights give
rewards spread over [0, 1], so GRPO advantages, and with them updates, are non-zero from the
first step (the tool environment needs a warm-up for that).
"""

import dataclasses

import numpy as np

STOP = 3


@dataclasses.dataclass
class State:
  task: int
  answer: tuple[int, ...] = ()
  done: bool = False


class ToyEnv:
  """See the module docstring."""

  pad_id = 0
  stop_ids = (STOP,)

  def sample_task(self, rng):
    return int(rng.integers(4, 12))

  def reset(self, task):
    return State(task), [1, task, 2]

  def step(self, state, tokens):
    return dataclasses.replace(state, answer=tuple(int(t) for t in tokens), done=True), []

  def reward(self, state):
    return float(np.mean([t % 2 == state.task % 2 for t in state.answer]))

  def feedback(self, episode):
    return [(1, [episode.task, episode.task])] if self.reward(episode.state) < 1 else []

  def episode_metrics(self, episodes):
    return {"reward": float(np.mean([e.trajectory.reward for e in episodes]))}
