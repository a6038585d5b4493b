"""`train.init_from`: start a run from imported weights instead of a random init.

Two kinds of directory are accepted:

* our imported checkpoint (`python -m composer_jax.convert.import_hf`, see
  `composer_jax.hf.checkpoint`): `config.json` + `variables/` (orbax). Each device reads
  only its own shards, straight into the run's target shardings and param dtype;
* a Hugging Face checkpoint directory (`config.json` + `*.safetensors`): read whole into
  host memory with `composer_jax.hf.importer.load_hf` — for small models; import big ones
  first.

Either way the checkpoint's architecture must equal the run's model config.
"""

from __future__ import annotations

import os
from typing import Any

import orbax.checkpoint as ocp

from composer_jax.hf import checkpoint as hf_checkpoint
from composer_jax.hf import importer
from composer_jax.model.config import ModelConfig
from composer_jax.train import checkpointing


def load(path: str, model_cfg: ModelConfig, target: Any) -> dict:
  """Variables `{'params', 'router'}` from `path`, placed like `target`.

  Args:
    path: imported-checkpoint or HF directory.
    model_cfg: the run's model; the checkpoint must have the same architecture.
    target: `{'params', 'router'}` tree of ShapeDtypeStruct with shardings.

  Raises:
    FileNotFoundError: `path` is not a directory with a `config.json`.
    ValueError: the checkpoint's architecture differs from `model_cfg` (names the fields).
  """
  where = f"train.init_from={path!r}"
  if not os.path.isfile(os.path.join(path, hf_checkpoint.CONFIG_FILE)):
    raise FileNotFoundError(
      f"{where}: no {hf_checkpoint.CONFIG_FILE} there; expected an "
      "imported checkpoint (import_hf output) or a Hugging Face directory"
    )
  variables_dir = os.path.join(os.path.abspath(path), hf_checkpoint.VARIABLES_DIR)
  if os.path.isdir(variables_dir):
    saved = hf_checkpoint.load_config(path)
    checkpointing.check_same_model(saved, model_cfg, where, ignore=("param_dtype",))
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    return ocp.PyTreeCheckpointer().restore(
      variables_dir, args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args)
    )
  saved = importer.read_config(path).model
  checkpointing.check_same_model(saved, model_cfg, where, ignore=("param_dtype",))
  return importer.load_hf(path, dtype=model_cfg.param_dtype)[1]
