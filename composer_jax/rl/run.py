"""An RL run in a workdir: `run(config, workdir, env, init)`.

RL steps (`rl.train.rl_steps`) on an environment (`rl.env.Env`) from initial variables, with
the same guarantees as the supervised loop: metrics to the console, `metrics.jsonl` and
TensorBoard (`train.metrics`); orbax checkpoints every `rl.ckpt_every` steps, at the end and on
SIGTERM; a run started again in the same workdir resumes bit-for-bit from its newest
checkpoint. Layout:

    <workdir>/checkpoints/<step>/{state,rng,config}
        state: params, optimizer state, EMA teacher (if any); rng: the task generator's
        bit-generator state (JSON); config: model config + run config (JSON).

Written atomically by orbax, so an interrupted save leaves the previous one intact.
"""

from __future__ import annotations

import functools
import operator
import os

import jax
import orbax.checkpoint as ocp
from absl import logging

from composer_jax.model.config import ModelConfig
from composer_jax.rl import train as rl_train
from composer_jax.rl.env import Env
from composer_jax.train import checkpointing, loop
from composer_jax.train.metrics import MetricsWriter, quiet_library_logs


def validate(config) -> None:
  """One-line ValueErrors for RL run settings that cannot work."""
  for section, names in (("rl", ("steps", "groups", "group_size", "seq_len", "log_every",
                                 "ckpt_every", "keep")),):
    for name in names:
      value = config[section][name]
      if value < 1:
        raise ValueError(f"{section}.{name}={value} must be >= 1")


# Settings that decide the tree of a checkpointed RL state (optimizer state; EMA weights or not).
_STATE_KEYS = (("rl", "optim", "name"), ("loss", "teacher"))


def _manager(directory: str, items: tuple[str, ...], keep: int | None = None):
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
  return ocp.CheckpointManager(directory, options=options, item_names=items + ("config",))


def _config_json(config) -> dict:
  return {"model": loop.model_config(config).to_dict(), "run": config.to_dict()}


def _check_model(mngr, step: int, config, where: str) -> dict:
  """The run config saved with checkpoint `step`, after checking it holds the same model."""
  saved = mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
  checkpointing.check_same_model(ModelConfig.from_dict(saved["model"]),
                                 loop.model_config(config), where)
  return saved["run"]


def _arrays(state: rl_train.RLState) -> dict:
  tree = {"params": state.params, "opt_state": state.opt_state}
  return tree if state.ema is None else {**tree, "ema": state.ema}


def _restore(mngr, step: int, config, init: dict, workdir: str) -> rl_train.RLState:
  saved = _check_model(mngr, step, config, f"--workdir {workdir}")
  for path in _STATE_KEYS:
    was, now = (functools.reduce(operator.getitem, path, c) for c in (saved, config))
    if was != now:
      raise ValueError(f"--workdir {workdir} holds an RL checkpoint made with {'.'.join(path)}="
                       f"{was!r}, this config has {now!r}; use a fresh --workdir or the saved "
                       "value")
  fresh = rl_train.initial_state(config, init)
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, _arrays(fresh))
  restored = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(target), rng=ocp.args.JsonRestore()))
  arrays = restored["state"]
  fresh.rng.bit_generator.state = restored["rng"]
  logging.info("Resuming RL from %s/%d", mngr.directory, step)
  return rl_train.RLState(step, arrays["params"], arrays["opt_state"], arrays.get("ema"),
                          fresh.rng)


def run(config, workdir: str, env: Env, init: dict) -> list[dict]:
  """RL on `env` from `init` = {'params', 'router'} (or from the newest checkpoint) up to
  `rl.steps` in `workdir`; returns the metric records written by this call (one per RL step;
  `step` counts finished steps).

  Raises:
    ValueError: bad config, or `workdir` holds checkpoints of a different model.
  """
  validate(config)
  quiet_library_logs()
  r = config.rl
  mngr = _manager(os.path.join(workdir, "checkpoints"), ("state", "rng"), keep=r.keep)
  latest = mngr.latest_step()
  resumed = _restore(mngr, latest, config, init, workdir) if latest is not None else None
  writer = MetricsWriter(workdir, r.steps, resumed.step if resumed else 0)
  stop = loop.StopFlag()
  config_json, records = _config_json(config), []
  try:
    for row, state in rl_train.rl_steps(config, env, init, resumed):
      record = {**row, "step": state.step}
      writer.write(record, console=state.step % r.log_every == 0 or state.step == r.steps)
      records.append(record)
      preempted = stop.event.is_set()
      if state.step % r.ckpt_every == 0 or state.step == r.steps or preempted:
        # The generator state is read now: the next step advances the same generator.
        mngr.save(state.step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(_arrays(state)),
            rng=ocp.args.JsonSave(state.rng.bit_generator.state),
            config=ocp.args.JsonSave(config_json)), force=True)
      if preempted:
        mngr.wait_until_finished()
        logging.info("Preemption signal: saved %s/%d; exiting", mngr.directory, state.step)
        break
  finally:
    stop.restore()
    writer.close()
    mngr.close()
  return records
