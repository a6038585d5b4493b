"""Held-out probe contexts of the tool-calling environment (`composer_jax.rl.probes`).

Each probe is a scripted episode on a task drawn from its own generator (never a training
task's stream): correct calls for the first 0..n-1 required capabilities, then a call to the
*unavailable* alias of the next one, `call WRONG <eot>`. That turn is flagged with the hint the
`unavailable_tool` feedback gives it (`ToolEnv.hint`, targeted or the full tool list); the probe
slot is the tool token (slot 1 of `call WRONG <eot>`) and the good id the offered alias.
"""

from __future__ import annotations

import numpy as np

from composer_jax.envs.tools import vocab as vocab_lib
from composer_jax.envs.tools.env import ToolEnv
from composer_jax.rl import probes
from composer_jax.rl.teacher import DistillTarget
from composer_jax.rl.trajectory import Trajectory, Turn


def probe_set(env: ToolEnv, rng: np.random.Generator, count: int, *, seq_len: int,
              teacher_seq_len: int, turn_len: int, all_tools: bool = False) -> dict:
  """`rl.probes.build_probe_set` of `count` probes drawn with `rng` (module docstring)."""
  if count < 1:
    raise ValueError(f"probe count={count} must be >= 1")
  trajs, targets, goods = [], [], []
  for i in range(count):
    task = env.sample_task(rng)
    state, first = env.reset(task)
    turns = [Turn(first)]
    done = int(rng.integers(len(task.required)))
    for cap in task.required[:done]:
      offered = next(t for t in vocab_lib.CAPABILITIES[cap] if t in task.available)
      ids = env.vocab.encode(["call", offered, "<eot>"])
      state, reply = env.step(state, ids)
      turns += [Turn(ids, [0.0] * 3), Turn(reply)]
    pair = vocab_lib.CAPABILITIES[task.required[done]]
    wrong = next(t for t in pair if t not in task.available)
    good = next(t for t in pair if t in task.available)
    turns.append(Turn(env.vocab.encode(["call", wrong, "<eot>"]), [0.0] * 3))
    trajs.append(Trajectory.from_turns(turns, 0.0, i))
    hint = env.hint(task, None if all_tools else wrong)
    targets.append(DistillTarget(i, len(turns) - 1, tuple(hint)))
    goods.append(env.vocab.ids[good])
  return probes.build_probe_set(trajs, targets, [1] * count, goods, seq_len=seq_len,
                                teacher_seq_len=teacher_seq_len, turn_len=turn_len,
                                pad_id=env.pad_id)
