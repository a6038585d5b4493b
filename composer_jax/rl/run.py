"""An RL run in a workdir: `run(config, workdir, env, init)`, through the training driver.

RL steps (`rl.train.RLSteps`) on an environment (`rl.env.Env`) from initial variables, run by
`train.loop.drive` like the supervised program: metrics to the console (every
`train.log_every` steps), `metrics.jsonl` and TensorBoard; checkpoints through the same
`train.checkpointing.Checkpointer` every `train.ckpt_every` steps, at the end and on SIGTERM;
a stop on a NaN/inf loss; a run started again in the same workdir resumes bit-for-bit from its
newest checkpoint. Checkpoint `<workdir>/checkpoints/<step>/`: `state` = params, optimizer
state, EMA teacher (if any); `data` = {'rng': the task generator's bit-generator state, 'env':
the environment's own state if it has one (`env.state_dict()`, e.g. a curriculum's pass
rates; restored with `env.load_state_dict`)} (JSON); `config` = model config + run config.
"""

from __future__ import annotations

import functools
import operator

import jax
import numpy as np

from composer_jax.rl import epochs, teacher_weights
from composer_jax.rl import train as rl_train
from composer_jax.rl.env import Env
from composer_jax.train import checkpointing, loop, placement
from composer_jax.train.metrics import quiet_library_logs

# Settings that decide the tree of a checkpointed RL state (optimizer state; EMA weights or not).
_STATE_KEYS = (("optim", "name"), ("loss", "teacher"))


def validate(config) -> None:
  """One-line ValueErrors for RL settings that cannot work (after `train.loop.validate`)."""
  loop.validate(config)
  r = config.rl
  for name in ("groups", "group_size", "seq_len", "prompt_len", "teacher_seq_len",
               "teacher_rows", "max_new_tokens"):
    if r[name] < 1:
      raise ValueError(f"rl.{name}={r[name]} must be >= 1")
  if r.probe_count < 0 or r.probe_every < 1:
    raise ValueError(f"rl.probe_count={r.probe_count} must be >= 0 (0 = off) and "
                     f"rl.probe_every={r.probe_every} >= 1")
  if r.max_staleness < 0:
    raise ValueError(f"rl.max_staleness={r.max_staleness} must be >= 0 (0 = on-policy)")
  if r.mode not in rl_train.MODES:
    raise ValueError(f"rl.mode={r.mode!r}; valid: {rl_train.MODES}")
  if r.max_staleness and r.mode != "disaggregated":
    raise ValueError(f"rl.max_staleness={r.max_staleness} needs rl.mode='disaggregated' "
                     "(colocated sampling is on-policy)")
  try:
    epochs.validate(r.epochs, r.minibatches, r.groups * r.group_size)
  except ValueError as e:
    raise ValueError(f"rl.{e}") from None
  n = placement.num_devices(config.mesh)
  rl_train.sampler_devices(config, [d.id for d in jax.devices()[:n]])


def _arrays(state: rl_train.RLState) -> dict:
  tree = {"params": state.params, "opt_state": state.opt_state}
  return tree if state.ema is None else {**tree, "ema": state.ema}


def _restore(ckpt, step: int, config, workdir: str, env: Env) -> rl_train.RLState:
  saved = ckpt.saved_config(step)
  for path in _STATE_KEYS:
    was, now = (functools.reduce(operator.getitem, path, c) for c in (saved["run"], config))
    if was != now:
      raise ValueError(f"--workdir {workdir} holds an RL checkpoint made with {'.'.join(path)}="
                       f"{was!r}, this config has {now!r}; use a fresh --workdir or the saved "
                       "value")
  prog = rl_train.update_program(config, loop.model_config(config))
  target = {"params": prog.progs.target.params, "opt_state": prog.progs.target.opt_state}
  if config.loss.teacher == "ema":
    target["ema"] = teacher_weights.EmaState(prog.progs.target.params)
  arrays = ckpt.restore(step, target)
  data = ckpt.restore_data(step)
  rng = np.random.default_rng()
  rng.bit_generator.state = data["rng"]
  if hasattr(env, "load_state_dict"):
    env.load_state_dict(data["env"])
  return rl_train.RLState(step, arrays["params"], arrays["opt_state"], arrays.get("ema"), rng)


class _Program:
  """The RL `train.loop.Program`: one `RLSteps` call per step."""

  def __init__(self, steps: rl_train.RLSteps, env: Env):
    self._steps, self._env = steps, env

  def step(self, state, step):
    del step  # state.step
    return self._steps(state)

  def record(self, step, metrics, state):
    return {**metrics(), "step": step}

  def checkpoint(self, state):
    # Both are read now: the next step advances the same generator and environment.
    env = self._env.state_dict() if hasattr(self._env, "state_dict") else {}
    return _arrays(state), {"rng": state.rng.bit_generator.state, "env": env}


def run(config, workdir: str, env: Env, init: dict) -> list[dict]:
  """RL on `env` from `init` = {'params', 'router'} (or from the newest checkpoint) up to
  `train.steps` in `workdir`; returns the metric records written by this call (one per RL
  step; `step` counts finished steps).

  Raises:
    ValueError: bad config, `workdir` holds checkpoints of a different model or RL state, or
      none of its checkpoints restores (`CorruptCheckpointError`).
    CheckpointSaveError: a checkpoint could not be written.
    train.loop.NonFiniteLossError: NaN/inf loss.
  """
  validate(config)
  quiet_library_logs()
  t = config.train
  ckpt = checkpointing.Checkpointer(workdir, keep=t.keep)
  try:
    state = loop.restore_newest(
        loop.model_config(config), ckpt,
        lambda step: _restore(ckpt, step, config, workdir, env), workdir)
    state = state or rl_train.initial_state(config, init)
    steps = rl_train.RLSteps(config, env, init, state)
  except BaseException:
    ckpt.close()
    raise
  try:
    return loop.drive(_Program(steps, env), state, state.step, ckpt, workdir=workdir,
                      total_steps=t.steps, ckpt_every=t.ckpt_every,
                      console_every=t.log_every, model_cfg=loop.model_config(config),
                      run_config=config.to_dict())
  finally:
    steps.close()
