"""The run config's `train` section (`default_config`) and the optimizer settings a run
trains with (`optim_config`). The whole schema is assembled in `experiments/configs/base.py`."""

from __future__ import annotations

import ml_collections


def default_config() -> ml_collections.ConfigDict:
  """Defaults of `config.train`: the supervised loop's (`train.loop`) and, for an RL run,
  the RL steps' (`rl.run`: steps, seed, logging, checkpoints, compile cache)."""
  return ml_collections.ConfigDict(
    {
      "steps": 300,  # optimizer steps of the run
      "batch_size": 16,  # global rows of seq_len tokens per optimizer step
      "seq_len": 128,
      "grad_accum": 1,  # micro-batches per step
      "log_every": 10,
      "eval_every": 50,  # 0 = only at the end
      "eval_batches": 4,
      "ckpt_every": 100,
      "keep": 3,  # checkpoints kept
      "seed": 0,
      "router_bias_rate": 1e-3,  # gamma of the aux-loss-free router-bias update
      "z_loss": 1e-4,
      "loss_chunk": 1024,  # tokens per vocab-projection chunk
      # '' = random init; else an import_hf output directory or a Hugging Face directory.
      "init_from": "",
      # Print the per-device memory plan for dry_run_devices devices and exit.
      "dry_run": False,
      "dry_run_devices": 1,
      # Testing aid: that step's loss mask is multiplied by NaN (the non-finite-loss stop).
      "nan_at_step": 0,
      # JAX's persistent compilation cache (`train.compile_cache`): '' = <workdir>/compile_cache,
      # 'none' = off; a directory owned by this user and writable by no one else.
      "compile_cache_dir": "",
    }
  )


def optim_config(config) -> ml_collections.ConfigDict:
  """`config.optim` with `total_steps` 0 (the default) replaced by `config.train.steps`: the
  LR schedule's length. A run stopped early and resumed under a larger `train.steps` keeps
  its schedule only if `optim.total_steps` is set explicitly."""
  optim = ml_collections.ConfigDict(config.optim.to_dict())
  if not optim.total_steps:
    optim.total_steps = config.train.steps
  return optim
