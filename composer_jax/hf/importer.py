"""HF DeepSeek-V3 / Kimi-K2 checkpoint -> our `(ModelConfig, {'params', 'router'})`.

`plan` validates a checkpoint from its headers alone (unknown model_type, missing or
extra tensors, shape mismatch vs config.json, fp8 without scale) before any weight is
read. `read_into` then streams one HF tensor at a time (dequantized to float32,
re-laid-out, cast) into its slice of a preallocated destination array: numpy arrays for
`load_hf`, disk-backed `np.memmap`s for `import_to_checkpoint`, so the CLI path holds one
HF tensor in host memory at a time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable

import jax
import numpy as np
from absl import logging

from composer_jax.hf import checkpoint, config_map, names
from composer_jax.hf.reader import SafetensorsDir, StoredWeight
from composer_jax.model.config import ModelConfig

Alloc = Callable[[names.Path, tuple[int, ...], np.dtype], np.ndarray]
_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_EXPERT = re.compile(r"model\.layers\.\d+\.mlp\.experts\.(\d+)\.")


def read_config(hf_dir: str, **overrides) -> config_map.HFConfig:
  path = os.path.join(hf_dir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: not a Hugging Face checkpoint directory")
  try:
    with open(path) as f:
      raw = json.load(f)
  except ValueError as e:
    raise ValueError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(raw, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(raw).__name__}")
  try:
    return config_map.from_hf(raw, **overrides)
  except (ValueError, TypeError) as e:
    raise ValueError(f"{path}: {e}") from None


def plan(hf: config_map.HFConfig, sd: SafetensorsDir) -> list[tuple[names.Entry, StoredWeight]]:
  """(entry, storage) for every tensor we import; raises on any checkpoint mismatch."""
  cfg, pre = hf.model, hf.prefix
  # Counts first: the tensor list below grows with layers x experts (a config.json claiming
  # 10^12 layers would be enumerated, not refused).
  for what, pattern, claimed, key in (
    ("layers", _LAYER, cfg.num_layers, "num_hidden_layers"),
    ("experts", _EXPERT, cfg.n_routed_experts if cfg.num_moe_layers else 0, "n_routed_experts"),
  ):
    held = 1 + max(
      (
        int(m.group(1))
        for n in sd.infos
        if n.startswith(pre) and (m := pattern.match(n[len(pre) :]))
      ),
      default=-1,
    )
    if claimed > held:
      raise ValueError(
        f"config.json {key}={claimed}, but the checkpoint's tensors hold {held} {what}"
      )
  out, used = [], set()
  for e in names.entries(cfg, hf.rope_interleave):
    stored = sd.resolve(pre + e.base, e.suffix)
    if stored is None:
      raise ValueError(f"Missing tensor {pre + e.name!r} (expected shape {e.hf_shape})")
    if stored.shape != e.hf_shape:
      raise ValueError(
        f"Tensor {pre + e.name!r} has shape {stored.shape}, expected {e.hf_shape} from config.json"
      )
    out.append((e, stored))
    used.update(stored.names)
  skipped, extra = [], []
  for name in sorted(set(sd.infos) - used):
    m = _LAYER.match(name[len(pre) :]) if name.startswith(pre) else None
    if not name.startswith(pre) or name.endswith("rotary_emb.inv_freq"):
      skipped.append(name)  # vision tower / projector of a multimodal wrapper, rope buffers
    elif m and cfg.num_layers <= int(m.group(1)) < cfg.num_layers + hf.num_mtp_layers:
      skipped.append(name)  # multi-token-prediction layer (DeepSeek-V3 §2.2)
    else:
      extra.append(name)
  if extra:
    raise ValueError(f"{len(extra)} unexpected tensor(s) for this config.json, e.g. {extra[:5]}")
  if skipped:
    logging.info(
      "Skipping %d tensors that are not part of the text model's main stack "
      "(MTP layers, vision tower, rope buffers), e.g. %s",
      len(skipped),
      skipped[:3],
    )
  return out


def read_into(
  hf_dir: str, alloc: Alloc, dtype: str | None = None, **overrides
) -> tuple[ModelConfig, dict]:
  """Streams the checkpoint into arrays from `alloc(path, shape, dtype)`; returns the tree.

  Params are cast to `dtype` (default: the config's param_dtype, float32); the router
  bias stays float32. The returned config has `param_dtype == dtype`.
  """
  if dtype is not None:
    overrides["param_dtype"] = dtype
  hf = read_config(hf_dir, **overrides)
  cfg = hf.model
  sd = SafetensorsDir(hf_dir)
  todo = plan(hf, sd)
  arrays = {}
  for path, shape in names.param_shapes(cfg).items():
    dt = np.dtype(np.float32) if path[0] == "router" else jax.numpy.dtype(cfg.param_dtype)
    arrays[path] = alloc(path, shape, dt)
  for entry, stored in todo:
    value = entry.to_ours(sd.weight(stored))
    dest = arrays[entry.path]
    dest[entry.index] = value.astype(dest.dtype)
  tree: dict = {"params": {}, "router": {}}  # 'router' stays {} without MoE layers
  for path, arr in arrays.items():
    node = tree
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = arr
  return cfg, tree


def load_hf(hf_dir: str, dtype: str | None = None, **overrides) -> tuple[ModelConfig, dict]:
  """In-memory import for notebooks and small models: `(config, variables)` of jax arrays."""
  cfg, tree = read_into(hf_dir, lambda _, shape, dt: np.empty(shape, dt), dtype, **overrides)
  return cfg, jax.tree.map(jax.numpy.asarray, tree)


def import_to_checkpoint(
  hf_dir: str, out_dir: str, dtype: str | None = None, **overrides
) -> ModelConfig:
  """Streaming import to our checkpoint format (see `checkpoint`) into `out_dir`, which must
  be new or empty (`convert.outputs.staged` gives a fresh directory that replaces an old one).

  Each destination array is a memory-mapped file in `out_dir/staging` (page cache, not
  resident memory), filled one HF tensor at a time, then written by orbax and deleted.
  """
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise ValueError(f"{out_dir} is not empty; import into a new or empty directory")
  staging = os.path.join(out_dir, "staging")
  os.makedirs(staging, exist_ok=True)

  def alloc(path, shape, dt):
    return np.memmap(os.path.join(staging, ".".join(path)), dtype=dt, mode="w+", shape=shape)

  try:
    cfg, tree = read_into(hf_dir, alloc, dtype, **overrides)
    checkpoint.save(out_dir, cfg, tree)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return cfg
