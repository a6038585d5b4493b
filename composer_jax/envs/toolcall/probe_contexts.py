"""Held-out probe contexts of the tool-calling environment (`composer_jax.rl.sd_probes`).

Each probe is a scripted episode on a task drawn from its own generator (never a training
task's stream), ending in a faulty model turn flagged with the hint its feedback kind gives:
  'unavailable_tool'   correct calls for the first 0..n-1 required capabilities, then
                       `call WRONG <eot>` with WRONG the unavailable alias of the next one; hint
                       `ToolEnv.hint` (targeted, or the full tool list with `all_tools`); probe
                       slot: the tool token; good id: the offered alias.
  'overlong_message'   every required call, then the verbose answer `answer result CAP... <eot>`;
                       hint `feedback.SHORT_HINT`; probe slot: `result`; good id: `<eot>` (the
                       short answer).
"""

from __future__ import annotations

import numpy as np

from composer_jax.envs.toolcall import feedback as feedback_lib
from composer_jax.envs.toolcall import vocab as vocab_lib
from composer_jax.rl import sd_probes
from composer_jax.rl.teacher import DistillTarget
from composer_jax.rl.trajectory import Trajectory, Turn

BEHAVIOURS = ("unavailable_tool", "overlong_message")


def probe_set(
  env,
  rng: np.random.Generator,
  count: int,
  *,
  seq_len: int,
  teacher_seq_len: int,
  turn_len: int,
  behaviour: str = "unavailable_tool",
  all_tools: bool = False,
) -> dict:
  """`rl.sd_probes.build_probe_set` of `count` probes of `behaviour` drawn with `rng` on `env`
  (an `envs.toolcall.ToolEnv`)."""
  if count < 1:
    raise ValueError(f"probe count={count} must be >= 1")
  if behaviour not in BEHAVIOURS:
    raise ValueError(f"probe behaviour={behaviour!r}; valid: {BEHAVIOURS}")
  trajs, targets, goods = [], [], []
  for i in range(count):
    task = env.sample_task(rng)
    state, first = env.reset(task)
    turns = [Turn(first)]
    verbose = behaviour == "overlong_message"
    done = len(task.required) if verbose else int(rng.integers(len(task.required)))
    for cap in task.required[:done]:
      offered = next(t for t in vocab_lib.CAPABILITIES[cap] if t in task.available)
      ids = env.vocab.encode(["call", offered, "<eot>"])
      state, reply = env.step(state, ids)
      turns += [Turn(ids, [0.0] * 3), Turn(reply)]
    if verbose:
      words = ["answer", "result", *dict.fromkeys(task.required), "<eot>"]
      hint, good = env.vocab.encode(feedback_lib.SHORT_HINT), "<eot>"
    else:
      pair = vocab_lib.CAPABILITIES[task.required[done]]
      wrong = next(t for t in pair if t not in task.available)
      good = next(t for t in pair if t in task.available)
      words, hint = ["call", wrong, "<eot>"], env.hint(task, None if all_tools else wrong)
    turns.append(Turn(env.vocab.encode(words), [0.0] * len(words)))
    trajs.append(Trajectory.from_turns(turns, 0.0, i))
    targets.append(DistillTarget(i, len(turns) - 1, tuple(hint)))
    goods.append(env.vocab.ids[good])
  return sd_probes.build_probe_set(
    trajs,
    targets,
    [1] * count,
    goods,
    seq_len=seq_len,
    teacher_seq_len=teacher_seq_len,
    turn_len=turn_len,
    pad_id=env.pad_id,
  )
