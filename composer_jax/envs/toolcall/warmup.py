"""Generated supervised warm-up data: scripted episodes that teach the tool-call format
(`warmup_batches`: an `rl.scripted.EpisodeBatches` for the supervised loop).

The scripted agent calls the required capabilities in task order and then answers. Before each
first attempt at a capability, with probability `hint_prob`, the reminder hint for it
(`ToolEnv.hint(task, tool)`, the offered alias) is inserted as an environment turn right before
the call, exactly where the self-distillation teacher puts it, and the call then uses the
offered alias. Without the hint the agent picks one of the capability's two aliases uniformly at
random (ignoring the tool list and `first_alias_prob`) and, after the `not_found` error, retries
with the other one. So the warmed-up model knows the format, reads the hint when it is there,
and ignores the tool list otherwise: the gap that RL and targeted self-distillation have to
close. `hint_all_tools`: the hint is the report's wording, the reminder listing *every* offered
tool (`ToolEnv.hint(task)`), so reading it means finding the needed capability's alias in a
list, as in the system turn.

The second behaviour (`verbose_prob` > 0): the scripted answer is the verbose summary
`answer result CAP... <eot>` with probability `verbose_prob`, else `answer <eot>`; with
probability `hint_prob` the hint `feedback.SHORT_HINT` comes before the answer, which is then
short. The verbose form never changes the reward.
"""

from __future__ import annotations

import numpy as np

from composer_jax.envs.toolcall import feedback as feedback_lib
from composer_jax.envs.toolcall import vocab as vocab_lib
from composer_jax.envs.toolcall.env import ToolEnv, ToolTask
from composer_jax.rl import scripted
from composer_jax.rl.trajectory import Trajectory, Turn


def scripted_turns(
  env: ToolEnv,
  task: ToolTask,
  rng: np.random.Generator,
  hint_prob: float,
  hint_all_tools: bool = False,
  verbose_prob: float = 0.0,
):
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
        turns.append(Turn(env.hint(task, None if hint_all_tools else tool)))
        tool = offered
      retry = None if tool == offered else offered
      words = ["call", tool, "<eot>"]
    else:
      words = ["answer", "<eot>"]
      if verbose_prob > 0:  # no extra draws otherwise: the default warm-up data stays the same
        if rng.random() < hint_prob:
          turns.append(Turn(env.vocab.encode(feedback_lib.SHORT_HINT)))
        elif rng.random() < verbose_prob:
          words = ["answer", "result", *dict.fromkeys(task.required), "<eot>"]
    ids = env.vocab.encode(words)
    turns.append(Turn(ids, [0.0] * len(ids)))
    state, reply = env.step(state, ids)
    if reply:
      turns.append(Turn(reply))
  return turns


def warmup_batches(
  env: ToolEnv,
  rng: np.random.Generator,
  *,
  batch_size: int,
  seq_len: int,
  hint_prob: float,
  hint_all_tools: bool = False,
  verbose_prob: float = 0.0,
) -> scripted.EpisodeBatches:
  """[batch_size, seq_len] batches of scripted episodes (tokens/targets/segment_ids/positions,
  loss_mask = model tokens), the tasks and the agent's choices drawn from `rng`."""
  for name, value in (("hint_prob", hint_prob), ("verbose_prob", verbose_prob)):
    if not 0.0 <= value <= 1.0:
      raise ValueError(f"{name}={value} must be in [0, 1]")

  def episode(rng):
    turns = scripted_turns(env, env.sample_task(rng), rng, hint_prob, hint_all_tools, verbose_prob)
    return Trajectory.from_turns(turns, 0.0, 0)

  return scripted.EpisodeBatches(
    episode, rng, batch_size=batch_size, seq_len=seq_len, pad_id=env.vocab.pad_id
  )
