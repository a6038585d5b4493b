"""An RL run in a workdir: `run(config, workdir, env, init)`, through the training driver.

RL steps (`rl.steps.RLSteps`) on an environment (`rl.env.Env`) from initial variables, run by
`train.loop.drive` like the supervised program: metrics to the console (every
`train.log_every` steps), `metrics.jsonl` and TensorBoard; checkpoints through the same
`train.checkpointing.Checkpointer` every `train.ckpt_every` steps, at the end and on SIGTERM;
a stop on a NaN/inf loss; a run started again in the same workdir resumes bit-for-bit from its
newest checkpoint (and does nothing when that is the last step). Checkpoint
`<workdir>/checkpoints/<step>/`: `state` = params, optimizer state, EMA teacher (if any);
`data` = {'rng': the task generator's bit-generator state, 'env': the environment's own state
if it has one (`env.state_dict()`, e.g. a curriculum's pass rates; restored with
`env.load_state_dict`)} (JSON); `config` = model config + run config.
"""

from __future__ import annotations

import jax
import numpy as np
from absl import logging

from composer_jax.model.config import model_config
from composer_jax.rl import epochs, losses, rollout, teacher_weights
from composer_jax.rl.env import Env
from composer_jax.rl.programs import update_program
from composer_jax.rl.state import RLState, initial_state
from composer_jax.rl.steps import MODES, RLSteps, sampler_devices
from composer_jax.train import checkpointing, compile_cache, loop, placement
from composer_jax.train.metrics import quiet_library_logs

# Settings that decide the tree of a checkpointed RL state (optimizer state; EMA weights or not).
_STATE_KEYS = (("optim", "name"), ("loss", "teacher"))


def validate(config) -> None:
  """One-line ValueErrors for RL settings that cannot work (after `train.loop.validate`):
  raised before any work (warm-up, compiling, sampling)."""
  loop.validate(config)
  r = config.rl
  for name in (
    "groups",
    "group_size",
    "seq_len",
    "prompt_len",
    "teacher_seq_len",
    "teacher_rows",
    "max_new_tokens",
  ):
    if r[name] < 1:
      raise ValueError(f"rl.{name}={r[name]} must be >= 1")
  if r.gap_rows < 0:
    raise ValueError(f"rl.gap_rows={r.gap_rows} must be >= 0 (0 = no teacher-gap rows)")
  if r.probe_count < 0 or r.probe_every < 1:
    raise ValueError(
      f"rl.probe_count={r.probe_count} must be >= 0 (0 = off) and "
      f"rl.probe_every={r.probe_every} >= 1"
    )
  rollout.check_sampling(r)
  positions = model_config(config.model).max_position_embeddings
  if r.prompt_len + r.max_new_tokens - 1 > positions:
    raise ValueError(
      f"rl.prompt_len={r.prompt_len} + rl.max_new_tokens={r.max_new_tokens} - 1 "
      f"exceeds the model's max_position_embeddings={positions} (the sampler's "
      "KV cache)"
    )
  if r.max_staleness < 0:
    raise ValueError(f"rl.max_staleness={r.max_staleness} must be >= 0 (0 = on-policy)")
  if r.mode not in MODES:
    raise ValueError(f"rl.mode={r.mode!r}; valid: {MODES}")
  if r.max_staleness and r.mode != "disaggregated":
    raise ValueError(
      f"rl.max_staleness={r.max_staleness} needs rl.mode='disaggregated' "
      "(colocated sampling is on-policy)"
    )
  try:
    epochs.validate(r.epochs, r.minibatches, r.groups * r.group_size)
  except ValueError as e:
    raise ValueError(f"rl.{e}") from None
  try:
    losses.validate(config.loss)
  except ValueError as e:
    raise ValueError(f"loss.{e}") from None
  n = placement.num_devices(config.mesh)
  sampler_devices(config, [d.id for d in jax.devices()[:n]])


def _restore(ckpt, step: int, config, workdir: str, env: Env) -> RLState:
  checkpointing.check_same_settings(
    ckpt.saved_config(step)["run"],
    config,
    _STATE_KEYS,
    f"--workdir {workdir} holds an RL checkpoint",
  )
  prog = update_program(config, model_config(config.model))
  target = {"params": prog.progs.target.params, "opt_state": prog.progs.target.opt_state}
  if config.loss.teacher == "ema":
    target["ema"] = teacher_weights.EmaState(prog.progs.target.params)
  arrays = ckpt.restore(step, target)
  data = ckpt.restore_data(step)
  rng = np.random.default_rng()
  rng.bit_generator.state = data["rng"]
  if hasattr(env, "load_state_dict"):
    env.load_state_dict(data["env"])
  return RLState(step, arrays["params"], arrays["opt_state"], arrays.get("ema"), rng)


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
  model_cfg = model_config(config.model)
  compile_cache.enable(compile_cache.cache_dir(t.compile_cache_dir, workdir))
  ckpt = checkpointing.Checkpointer(workdir, keep=t.keep)
  steps = None
  try:
    state = loop.restore_newest(
      model_cfg, ckpt, lambda step: _restore(ckpt, step, config, workdir, env), workdir
    )
    if state is not None and state.step >= t.steps:
      logging.info("Checkpoint step %d >= train.steps=%d: nothing to do", state.step, t.steps)
      ckpt.close()
      return []
    state = state or initial_state(config, init)
    steps = RLSteps(config, env, init, state)
  except BaseException:
    ckpt.close()
    raise
  try:
    return loop.drive(
      steps,
      state,
      state.step,
      ckpt,
      workdir=workdir,
      total_steps=t.steps,
      ckpt_every=t.ckpt_every,
      console_every=t.log_every,
      model_cfg=model_cfg,
      run_config=config.to_dict(),
    )
  finally:
    steps.close()
