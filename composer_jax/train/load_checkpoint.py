"""Model weights from any checkpoint directory, for inference (evaluation, sampling).

  load(path) -> (ModelConfig, {'params', 'router'})  numpy leaves, host memory

The directory's layout says what it is:
  imported  `config.json` + `variables/` (`python -m composer_jax.convert.import_hf`)
  hf        `config.json` + `*.safetensors`, a Hugging Face DeepSeek-V3 / Kimi-K2 checkpoint
            (read whole: for small models; import big ones first)
  workdir   `checkpoints/<step>/{state, config}` of a training run (`train.checkpointing`) or
            an RL run (`rl.run`): the newest step, its `state` item restored as saved
Anything else is one clear ValueError naming the directory and the layouts accepted.

An RL run keeps its initial router bias fixed and saves params only, so for an RL workdir the
router bias is the one the run started from: its supervised warm-up's (`<workdir>/warmup`, a
workdir of its own: the tool-feedback and coding experiments), else its `train.init_from`
checkpoint's, else a random init's, which is all zeros (`model.moe`: the bias starts at 0;
only the supervised loop updates it).
"""

from __future__ import annotations

import glob
import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from composer_jax.hf import checkpoint as hf_checkpoint
from composer_jax.hf import importer
from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig

LAYOUTS = {
  "imported": "an imported checkpoint (config.json + variables/)",
  "hf": "a Hugging Face directory (config.json + *.safetensors)",
  "workdir": "a training or RL workdir (checkpoints/<step>/)",
}


def kind(path: str) -> str:
  """'imported', 'hf' or 'workdir'; ValueError (one line) for anything else."""
  if os.path.isfile(os.path.join(path, hf_checkpoint.CONFIG_FILE)):
    if os.path.isdir(os.path.join(path, hf_checkpoint.VARIABLES_DIR)):
      return "imported"
    if glob.glob(os.path.join(path, "*.safetensors")):
      return "hf"
  if _steps(path):
    return "workdir"
  raise ValueError(f"checkpoint {path!r} is none of: {'; '.join(LAYOUTS.values())}")


def is_kind(path: str, layout: str) -> bool:
  """Whether `path` holds a checkpoint of `layout` ('imported', 'hf' or 'workdir')."""
  try:
    return kind(path) == layout
  except ValueError:
    return False


def _steps(path: str) -> list[int]:
  directory = os.path.join(path, "checkpoints")
  if not os.path.isdir(directory):
    return []
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


def load(path: str) -> tuple[ModelConfig, dict]:
  """`(model config, {'params', 'router'})` of the checkpoint at `path` (module docstring).

  Raises:
    ValueError: not a checkpoint layout.
    FileNotFoundError / OSError: unreadable files (the message names them).
  """
  path = os.path.abspath(os.path.expanduser(path))
  found = kind(path)
  if found == "imported":
    return hf_checkpoint.load_config(path), hf_checkpoint.load(path)
  if found == "hf":
    return importer.load_hf(path)
  step = _steps(path)[-1]
  mngr = ocp.CheckpointManager(os.path.join(path, "checkpoints"), item_names=("state", "config"))
  try:
    restored = mngr.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(), config=ocp.args.JsonRestore())
    )
  finally:
    mngr.close()
  cfg, state = ModelConfig.from_dict(restored["config"]["model"]), restored["state"]
  router = state["router"] if "router" in state else _initial_router(path, cfg, restored["config"])
  return cfg, jax.tree.map(np.asarray, {"params": state["params"], "router": router})


def run_config(path: str) -> dict:
  """The run config saved with the newest checkpoint of a training or RL workdir (a dict of
  sections: env, rl, train, ...); {} for the other layouts, which have none."""
  path = os.path.abspath(os.path.expanduser(path))
  try:
    if kind(path) != "workdir":
      return {}
  except ValueError:  # not a checkpoint at all: load() says so
    return {}
  with ocp.CheckpointManager(
    os.path.join(path, "checkpoints"), item_names=("state", "config")
  ) as mngr:
    saved = mngr.restore(_steps(path)[-1], args=ocp.args.Composite(config=ocp.args.JsonRestore()))
  return saved["config"].get("run", {})


def _initial_router(path: str, cfg: ModelConfig, saved_config: dict):
  """The router bias an RL run in `path` started from (module docstring)."""
  warmup = os.path.join(path, "warmup")  # a workdir of its own (`train.checkpointing`)
  if _steps(warmup):
    return load(warmup)[1]["router"]
  init_from = saved_config.get("run", {}).get("train", {}).get("init_from")
  if init_from:
    return load(init_from)[1]["router"]
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))["router"]
  return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
