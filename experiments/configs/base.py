"""The run-config schema shared by every experiment config (`get_base_config`).

`program` picks what `experiments.run` runs: 'lm' (supervised, `train.loop`) or 'rl' (an RL
program, see `rl_tool_feedback.py`). Sections (all `ml_collections.ConfigDict`, every field
overridable as `--config.a.b=v`):

* `model`: `preset` (a name in `composer_jax.model.config.PRESETS`) and `overrides`, a dict
  of `ModelConfig` fields applied on top (only fields present in the config file can be
  overridden from the command line).
* `optim`: `composer_jax.optim.build_optimizer` fields; `total_steps` follows `train.steps`.
* `data`: `composer_jax.data.default_config()` fields (`paths` '' = the stdlib sources).
* `train`: steps, global batch_size (rows of seq_len tokens per optimizer step), seq_len,
  grad_accum (micro-batches per step), log_every, eval_every (0 = only at the end),
  eval_batches, ckpt_every, keep (checkpoints kept), seed, router_bias_rate (gamma of the
  aux-loss-free bias update), z_loss, loss_chunk (tokens per vocab-projection chunk),
  init_from ('' = random init; else an import_hf output dir or an HF dir), dry_run (print
  the per-device memory plan for dry_run_devices devices and exit), nan_at_step (testing
  aid: that step's loss mask is multiplied by NaN, to exercise the non-finite-loss stop),
  compile_cache_dir (JAX's persistent compilation cache: '' = `<workdir>/compile_cache`,
  'none' = off; `composer_jax.train.compile_cache`).
* `mesh`, `rules`: the parallel layout (`composer_jax.parallel`); `layout` names it. The
  default 'single' is one device.
* `rl`, `loss`: RL programs only (`composer_jax.rl.config`): sampling, batch shapes,
  colocated/disaggregated mode; the RL + self-distillation loss. An RL program's steps, seed,
  logging, checkpoints and optimizer are `train` and `optim` above.
"""

import ml_collections

from composer_jax import data
from composer_jax.parallel.mesh import default_mesh_config
from composer_jax.rl.config import rl_config, rl_loss_config
from experiments.configs import layouts


def set_layout(config: ml_collections.ConfigDict, name: str) -> None:
  """Fills `config.mesh` / `config.rules` from a named layout ('single' = one device)."""
  if name == "single":
    layout = layouts.get_config()
    layout.mesh = default_mesh_config(fsdp=1, expert=1)
  else:
    layout = layouts.get_config(name)
  config.layout = name
  config.mesh = layout.mesh
  config.rules = layout.rules


def get_base_config() -> ml_collections.ConfigDict:
  """Defaults for every field; experiment configs change what they need."""
  c = ml_collections.ConfigDict()
  c.program = "lm"
  c.model = ml_collections.ConfigDict({"preset": "tiny", "overrides": {}})
  c.train = ml_collections.ConfigDict({
      "steps": 300, "batch_size": 16, "seq_len": 128, "grad_accum": 1,
      "log_every": 10, "eval_every": 50, "eval_batches": 4,
      "ckpt_every": 100, "keep": 3, "seed": 0,
      "router_bias_rate": 1e-3, "z_loss": 1e-4, "loss_chunk": 1024,
      "init_from": "", "dry_run": False, "dry_run_devices": 1, "nan_at_step": 0,
      "compile_cache_dir": "",
  })
  c.optim = ml_collections.ConfigDict({
      "name": "muon", "lr": 0.02, "adam_lr": 3e-3, "schedule": "cosine",
      "warmup_steps": 20, "total_steps": c.train.get_ref("steps"), "min_lr_ratio": 0.1,
      "wsd_decay_fraction": 0.2, "weight_decay": 0.0, "b1": 0.9, "b2": 0.95, "eps": 1e-8,
      "momentum": 0.95, "nesterov": True, "ns_coeffs": "quintic", "ns_steps": 5,
      "ns_precision": "float32",
      "muon_scale": "consistent_rms", "grad_clip": 1.0,
  })
  c.data = data.default_config()
  c.rl = rl_config()
  c.loss = rl_loss_config()
  set_layout(c, "single")
  return c
