"""Our on-disk checkpoint of imported weights: `config.json` + an orbax PyTree.

Layout of `DIR`: `DIR/config.json` (`ModelConfig.to_dict()`) and `DIR/variables` (an
orbax PyTree checkpoint of the unboxed `{'params', 'router'}` tree, numpy leaves).
Restore it onto a mesh with orbax and the target shardings, or with `load` below.

Saving is bounded in host memory whatever the model size: leaves may be disk-backed
`np.memmap`s, and are written as one zarr array per leaf (no OCDBT, which buffers whole
arrays before its writes) in chunks of at most `CHUNK_BYTES`, so tensorstore encodes and
writes a few chunks at a time. Chunks never straddle two layers or two experts, so one
HF tensor (`leaf[layer, expert]`) can be read back alone (`open_leaf`, used by export).
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from composer_jax.hf import names
from composer_jax.model.config import ModelConfig

CHUNK_BYTES = 16 << 20
CONFIG_FILE = "config.json"
VARIABLES_DIR = "variables"


def _checkpointer() -> ocp.Checkpointer:
  # The default numpy handler deep-copies every host array before its async write,
  # which would pull a memory-mapped model fully into RAM; write from the arrays as is.
  registry = ocp.type_handlers.create_type_handler_registry(
    (np.ndarray, ocp.type_handlers.NumpyHandler(deepcopy_host_arrays=False)),
    (jax.Array, ocp.type_handlers.get_type_handler(jax.Array)),
  )
  return ocp.Checkpointer(
    ocp.PyTreeCheckpointHandler(type_handler_registry=registry, use_ocdbt=False)
  )


def save(ckpt_dir: str, cfg: ModelConfig, variables: dict) -> None:
  """Writes `cfg` and `variables` (numpy or np.memmap leaves) under `ckpt_dir`."""
  ckpt_dir = os.path.abspath(ckpt_dir)
  os.makedirs(ckpt_dir, exist_ok=True)
  with open(os.path.join(ckpt_dir, CONFIG_FILE), "w") as f:
    json.dump(cfg.to_dict(), f, indent=2)
  ranks = names.index_ranks(cfg)
  save_args = jax.tree_util.tree_map_with_path(
    lambda kp, _: ocp.SaveArgs(
      chunk_byte_size=CHUNK_BYTES, shard_axes=tuple(range(ranks[tuple(k.key for k in kp)]))
    ),
    variables,
  )
  _checkpointer().save(
    os.path.join(ckpt_dir, VARIABLES_DIR), args=ocp.args.PyTreeSave(variables, save_args=save_args)
  )


def load_config(ckpt_dir: str) -> ModelConfig:
  path = os.path.join(ckpt_dir, CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: not a composer_jax checkpoint directory")
  with open(path) as f:
    return ModelConfig.from_dict(json.load(f))


def load(ckpt_dir: str) -> dict:
  """Restores the whole variables tree as numpy arrays (small models, tests)."""
  return ocp.PyTreeCheckpointer().restore(os.path.join(os.path.abspath(ckpt_dir), VARIABLES_DIR))


def open_leaf(ckpt_dir: str, path: tuple[str, ...]) -> ts.TensorStore:
  """One leaf as a lazy array: indexing and `np.asarray` read only the chunks needed.

  Relies on the layout `save` writes (one zarr array per leaf, named by its dotted path).
  """
  leaf_dir = os.path.join(os.path.abspath(ckpt_dir), VARIABLES_DIR, ".".join(path))
  if not os.path.isdir(leaf_dir):
    raise FileNotFoundError(f"No leaf {'/'.join(path)!r} in checkpoint {ckpt_dir!r}")
  return ts.open(
    {"driver": "zarr", "kvstore": {"driver": "file", "path": leaf_dir}}, open=True, read=True
  ).result()
