"""The tool-calling program: environment glue, supervised warm-up, then RL (`rl.run`).

    make_env(config)        `envs.tools.ToolEnv` (the `rl.env.Env` plug-in) from `config.env`
                            and the feedback kinds of `config.rl`.
    warmup(config)          supervised steps on scripted episodes (`envs.tools.warmup`): the
                            tool-call format, and reading the reminder hint when it is there.
    warmed_up(config, workdir)
                            the warm-up, computed once and saved under `<workdir>/warmup`.
    run(config, workdir)    warm-up (or its checkpoint), then RL steps through `rl.run`.
"""

from __future__ import annotations

import functools
import json
import os

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from composer_jax.envs.tools.env import ToolEnv
from composer_jax.envs.tools.vocab import Vocab
from composer_jax.envs.tools.warmup import warmup_batch
from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig
from composer_jax.optim import build_optimizer, make_schedule, param_labels
from composer_jax.rl import run as rl_run
from composer_jax.train import checkpointing, loop
from composer_jax.train import step as step_lib
from composer_jax.train.state import init_state

# What the warm-up depends on besides the model: a saved warm-up is reused only if they match.
_WARMUP_KEYS = ("seed", "env", "warmup")


def make_env(config) -> ToolEnv:
  """The environment of `config.env`, flagging turns with `config.rl.feedback_kinds`."""
  vocab = Vocab()
  model_vocab = loop.model_config(config).vocab_size
  if model_vocab < vocab.size:
    raise ValueError(
      f"model vocab_size={model_vocab} must be >= the environment vocabulary ({vocab.size} words)"
    )
  options = {k: v for k, v in config.env.items() if k != "name"}
  return ToolEnv(vocab, **options, feedback_kinds=tuple(config.rl.feedback_kinds),
                 feedback_options=config.rl.feedback_options.to_dict())


def validate(config) -> None:
  """One-line ValueErrors for warm-up settings that cannot work."""
  for name in ("steps", "batch_size", "seq_len", "log_every"):
    if config.warmup[name] < 1:
      raise ValueError(f"warmup.{name}={config.warmup[name]} must be >= 1")


@functools.lru_cache(maxsize=4)
def _warmup_step(model_cfg: ModelConfig, warmup_cfg: ml_collections.FrozenConfigDict):
  """(optimizer, jitted train step), cached so that every seed of a sweep compiles once."""
  axes = transformer.logical_axes(model_cfg)["params"]
  tx = build_optimizer(warmup_cfg.optim, axes)
  step = step_lib.make_train_step(
    model_cfg,
    tx,
    make_schedule(warmup_cfg.optim, warmup_cfg.optim.lr),
    param_labels(warmup_cfg.optim, axes),
    loss_chunk=model_cfg.vocab_size,
    z_loss=0.0,
    router_bias_rate=warmup_cfg.router_bias_rate,
  )
  return tx, jax.jit(step, donate_argnums=0)


def warmup(config) -> tuple[dict, float]:
  """Supervised warm-up from a random init; returns ({'params', 'router'}, last step's CE)."""
  model_cfg, env, w = loop.model_config(config), make_env(config), config.warmup
  tx, step = _warmup_step(model_cfg, ml_collections.FrozenConfigDict(w))
  state = init_state(model_cfg, tx, jax.random.key(config.seed))
  rng = np.random.default_rng([config.seed, 0])
  ce = float("nan")
  for i in range(w.steps):
    batch = warmup_batch(env, rng, w.batch_size, w.seq_len, w.hint_prob)
    state, metrics = step(state, {k: v[None] for k, v in batch.items()})
    if i == w.steps - 1 or (i + 1) % w.log_every == 0:
      ce = float(metrics["ce"])
      logging.info("warmup step %d ce %.4f", i + 1, ce)
  return {"params": state.params, "router": state.router}, ce


def _config_json(config) -> dict:
  return {"model": loop.model_config(config).to_dict(), "run": config.to_dict()}


def warmed_up(config, workdir: str) -> dict:
  """{'params', 'router'} after the supervised warm-up: restored from `<workdir>/warmup`
  when there, else computed (`warmup`) and saved there."""
  options = ocp.CheckpointManagerOptions(create=True)
  with ocp.CheckpointManager(os.path.join(workdir, "warmup"), options=options,
                             item_names=("variables", "config")) as mngr:
    step = mngr.latest_step()
    if step is not None:
      saved = mngr.restore(step, args=ocp.args.Composite(
          config=ocp.args.JsonRestore()))["config"]
      checkpointing.check_same_model(ModelConfig.from_dict(saved["model"]),
                                     loop.model_config(config), f"{workdir}/warmup")
      current = json.loads(json.dumps(config.to_dict()))  # tuples -> lists, as saved
      changed = [k for k in _WARMUP_KEYS if saved["run"][k] != current[k]]
      if changed:
        raise ValueError(f"{workdir}/warmup was made with other {', '.join(changed)} settings "
                         f"than this config; use a fresh --workdir or the saved settings")
      logging.info("Warm-up restored from %s/%d", mngr.directory, step)
      return mngr.restore(step, args=ocp.args.Composite(
          variables=ocp.args.StandardRestore()))["variables"]
    variables, _ = warmup(config)
    mngr.save(config.warmup.steps, args=ocp.args.Composite(
        variables=ocp.args.StandardSave(variables), config=ocp.args.JsonSave(_config_json(config))))
    return variables


def run(config, workdir: str) -> list[dict]:
  """Warm-up (or its checkpoint in `workdir`), then RL (`rl.run.run`); returns its records."""
  validate(config)
  rl_run.validate(config)
  env = make_env(config)
  return rl_run.run(config, workdir, env, warmed_up(config, workdir))
