"""Generated supervised warm-up data: scripted episodes that teach the tool-call format.

The scripted agent calls the required capabilities in task order and then answers. Before each
first attempt at a capability, with probability `hint_prob`, the reminder hint for it
(`ToolEnv.hint(task, tool)`, the offered alias) is inserted as an environment turn right before
the call, exactly where the self-distillation teacher puts it, and the call then uses the
offered alias. Without the hint the agent picks one of the capability's two aliases uniformly at
random (ignoring the tool list and `first_alias_prob`) and, after the `not_found` error, retries
with the other one. So the warmed-up model knows the format, reads the hint when it is there,
and ignores the tool list otherwise: the gap that RL and targeted self-distillation have to
close.
"""

from __future__ import annotations

import numpy as np

from composer_jax.envs.tools import vocab as vocab_lib
from composer_jax.envs.tools.env import ToolEnv, ToolTask
from composer_jax.rl.trajectory import Trajectory, Turn, pack_batch


def scripted_turns(env: ToolEnv, task: ToolTask, rng: np.random.Generator, hint_prob: float):
  """The turns of one scripted episode (model turns carry zero log-probs)."""
  state, first = env.reset(task)
  turns = [Turn(first)]
  pending, retry = list(task.required), None
  while not state.done:
    if retry is not None:
      words, retry = ["call", retry, "<eot>"], None
    elif pending:
      pair = vocab_lib.CAPABILITIES[pending.pop(0)]
      offered = next(t for t in pair if t in task.available)
      tool = pair[rng.integers(2)]
      if rng.random() < hint_prob:
        turns.append(Turn(env.hint(task, tool)))
        tool = offered
      retry = None if tool == offered else offered
      words = ["call", tool, "<eot>"]
    else:
      words = ["answer", "<eot>"]
    ids = env.vocab.encode(words)
    turns.append(Turn(ids, [0.0] * len(ids)))
    state, reply = env.step(state, ids)
    if reply:
      turns.append(Turn(reply))
  return turns


def warmup_batch(
  env: ToolEnv, rng: np.random.Generator, batch_size: int, seq_len: int, hint_prob: float
) -> dict[str, np.ndarray]:
  """[batch, seq_len] tokens/targets/segment_ids/positions and loss_mask (= model tokens)."""
  if not 0.0 <= hint_prob <= 1.0:
    raise ValueError(f"hint_prob={hint_prob} must be in [0, 1]")
  trajs = [
    Trajectory.from_turns(scripted_turns(env, env.sample_task(rng), rng, hint_prob), 0.0, 0)
    for _ in range(batch_size)
  ]
  packed = pack_batch(trajs, [seq_len], pad_id=env.vocab.pad_id)
  keys = ("tokens", "targets", "segment_ids", "positions")
  return {k: packed[k] for k in keys} | {"loss_mask": packed["model_mask"]}
