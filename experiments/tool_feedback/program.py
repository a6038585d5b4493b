"""The tool-calling program: environment glue, supervised warm-up, then RL (`rl.run`).

make_env(config)        `envs.toolcall.ToolEnv` (the `rl.env.Env` plug-in) from `config.env`
                        and the feedback kinds of `config.rl`.
warmed_up(config, workdir)
                        {'params', 'router'} after the warm-up on scripted episodes
                        (`envs.toolcall.warmup`: the tool-call format, and reading the
                        reminder hint when it is there): the one supervised loop
                        (`train.loop.trained_variables`, `rl.scripted.warmup_config`) in
                        `<workdir>/warmup`, with its metrics, checkpoints and resume; read
                        back when it is done.
run(config, workdir)    warm-up (or its checkpoint), then RL steps through `rl.run`.
"""

from __future__ import annotations

import os

import numpy as np

from composer_jax.envs.toolcall.env import ToolEnv
from composer_jax.envs.toolcall.vocab import Vocab
from composer_jax.envs.toolcall.warmup import warmup_batches
from composer_jax.model.config import model_config
from composer_jax.rl import run as rl_run
from composer_jax.rl import scripted
from composer_jax.train import checkpointing, compile_cache, loop

# What the warm-up depends on besides the model: a saved warm-up is reused only if they match.
_WARMUP_KEYS = (("train", "seed"), ("env",), ("warmup",))


def make_env(config) -> ToolEnv:
  """The environment of `config.env`, flagging turns with `config.rl.feedback_kinds`."""
  vocab = Vocab()
  model_vocab = model_config(config.model).vocab_size
  if model_vocab < vocab.size:
    raise ValueError(
      f"model vocab_size={model_vocab} must be >= the environment vocabulary ({vocab.size} words)"
    )
  options = {k: v for k, v in config.env.items() if k != "name"}
  return ToolEnv(
    vocab,
    **options,
    feedback_kinds=tuple(config.rl.feedback_kinds),
    feedback_options=config.rl.feedback_options.to_dict(),
  )


def validate(config) -> None:
  """One-line ValueErrors for warm-up settings that cannot work."""
  for name in ("steps", "batch_size", "seq_len", "log_every", "ckpt_every"):
    if config.warmup[name] < 1:
      raise ValueError(f"warmup.{name}={config.warmup[name]} must be >= 1")
  for name in ("hint_prob", "verbose_prob"):
    if not 0.0 <= config.warmup[name] <= 1.0:
      raise ValueError(f"warmup.{name}={config.warmup[name]} must be in [0, 1]")
  try:
    loop.validate(scripted.warmup_config(config))
  except ValueError as e:
    raise ValueError(f"the warm-up's {e}") from None


def warmed_up(config, workdir: str) -> dict:
  """{'params', 'router'} after the supervised warm-up in `<workdir>/warmup` (module
  docstring); its tasks and the scripted agent's choices come from one generator seeded by
  `train.seed`.

  Raises:
    ValueError: `<workdir>/warmup` holds a warm-up made with other env, warm-up or seed
      settings.
  """
  directory = os.path.join(workdir, "warmup")
  ckpt = checkpointing.Checkpointer(directory, keep=1)
  try:
    step = ckpt.latest_step()
    if step is not None:
      checkpointing.check_same_settings(
        ckpt.saved_config(step)["run"], config, _WARMUP_KEYS, f"{directory} holds a warm-up"
      )
  finally:
    ckpt.close()
  w = config.warmup
  batches = warmup_batches(
    make_env(config),
    np.random.default_rng([config.train.seed, 0]),
    batch_size=w.batch_size,
    seq_len=w.seq_len,
    hint_prob=w.hint_prob,
    hint_all_tools=w.hint_all_tools,
    verbose_prob=w.verbose_prob,
  )
  warmup = scripted.warmup_config(config)
  # The RL run's compile cache (one directory per process: the first one set is used).
  cache = compile_cache.cache_dir(config.train.compile_cache_dir, workdir)
  warmup.train.compile_cache_dir = cache or compile_cache.OFF
  return loop.trained_variables(warmup, directory, scripted.data(batches))


def run(config, workdir: str) -> list[dict]:
  """Warm-up (or its checkpoint in `workdir`), then RL (`rl.run.run`); returns its records."""
  rl_run.validate(config)
  validate(config)
  env = make_env(config)
  return rl_run.run(config, workdir, env, warmed_up(config, workdir))
