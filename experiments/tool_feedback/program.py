"""The tool-calling program: environment glue, supervised warm-up, then RL (`rl.run`).

    make_env(config)        `envs.tools.ToolEnv` (the `rl.env.Env` plug-in) from `config.env`
                            and the feedback kinds of `config.rl`.
    warmup(config)          supervised steps on scripted episodes (`envs.tools.warmup`): the
                            tool-call format, and reading the reminder hint when it is there.
    warmed_up(config, workdir)
                            the warm-up, computed once and saved under
                            `<workdir>/warmup/checkpoints`.
    run(config, workdir)    warm-up (or its checkpoint), then RL steps through `rl.run`.
"""

from __future__ import annotations

import functools
import json
import operator
import os

import jax
import ml_collections
import numpy as np
from absl import logging

from composer_jax.envs.tools.env import ToolEnv
from composer_jax.envs.tools.vocab import Vocab
from composer_jax.envs.tools.warmup import warmup_batch
from composer_jax.model.config import ModelConfig
from composer_jax.rl import run as rl_run
from composer_jax.train import checkpointing, loop, placement, programs

# What the warm-up depends on besides the model: a saved warm-up is reused only if they match.
_WARMUP_KEYS = (("train", "seed"), ("env",), ("warmup",))


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


def warmup_config(config) -> ml_collections.ConfigDict:
  """The warm-up as a supervised run config: `config` with the `warmup` section's optimizer,
  batch shape and router-bias rate, full-vocabulary loss chunks and no z-loss."""
  w = config.warmup
  c = config.copy_and_resolve_references()
  c.optim = w.optim.copy_and_resolve_references()
  c.train.update(dict(steps=w.steps, batch_size=w.batch_size, seq_len=w.seq_len, grad_accum=1,
                      loss_chunk=loop.model_config(config).vocab_size, z_loss=0.0,
                      router_bias_rate=w.router_bias_rate))
  return c


def warmup(config) -> tuple[dict, float]:
  """Supervised warm-up from a random init; returns ({'params', 'router'}, last step's CE).

  Runs the supervised trainer's program (`train.programs`: same layout, same compile cache,
  shared by every seed of a sweep) on generated batches of scripted episodes.
  """
  model_cfg, env, w = loop.model_config(config), make_env(config), config.warmup
  progs = programs.programs(warmup_config(config), model_cfg)
  state = progs.init(jax.random.PRNGKey(config.train.seed), None)
  rng = np.random.default_rng([config.train.seed, 0])
  ce = float("nan")
  for i in range(w.steps):
    batch = warmup_batch(env, rng, w.batch_size, w.seq_len, w.hint_prob, w.hint_all_tools,
                         w.verbose_prob)
    # Every process generates the same batch (same rng) and keeps its rows.
    state, metrics = progs.train_step(state, placement.to_global(
        {k: v[None] for k, v in batch.items()}, progs.train_batch_sharding, whole=True))
    if i == w.steps - 1 or (i + 1) % w.log_every == 0:
      ce = float(metrics["ce"])
      logging.info("warmup step %d ce %.4f", i + 1, ce)
  return {"params": state.params, "router": state.router}, ce


def _get(config, path: tuple[str, ...]):
  return functools.reduce(operator.getitem, path, config)


def warmed_up(config, workdir: str) -> dict:
  """{'params', 'router'} after the supervised warm-up: restored from `<workdir>/warmup`
  when there, else computed (`warmup`) and saved there (`train.checkpointing.Checkpointer`)."""
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, "warmup"), keep=1)
  try:
    step = ckpt.latest_step()
    model_cfg = loop.model_config(config)
    if step is not None:
      saved = ckpt.saved_config(step)
      checkpointing.check_same_model(ModelConfig.from_dict(saved["model"]), model_cfg,
                                     f"{workdir}/warmup")
      current = json.loads(json.dumps(config.to_dict()))  # tuples -> lists, as saved
      changed = [".".join(k) for k in _WARMUP_KEYS
                 if _get(saved["run"], k) != _get(current, k)]
      if changed:
        raise ValueError(f"{workdir}/warmup was made with other {', '.join(changed)} settings "
                         f"than this config; use a fresh --workdir or the saved settings")
      logging.info("Warm-up restored from %s/%d", ckpt.directory, step)
      target = programs.programs(warmup_config(config), model_cfg).target
      return ckpt.restore(step, {"params": target.params, "router": target.router})
    variables, _ = warmup(config)
    ckpt.save(config.warmup.steps, variables, {}, model_cfg, config.to_dict())
    return variables
  finally:
    ckpt.close()


def run(config, workdir: str) -> list[dict]:
  """Warm-up (or its checkpoint in `workdir`), then RL (`rl.run.run`); returns its records."""
  rl_run.validate(config)
  validate(config)
  env = make_env(config)
  return rl_run.run(config, workdir, env, warmed_up(config, workdir))
