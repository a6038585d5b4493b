"""Our `{'params', 'router'}` -> a Hugging Face `deepseek_v3` checkpoint directory.

Writes `config.json`, safetensors shards and `model.safetensors.index.json`, so that
transformers (`DeepseekV3ForCausalLM.from_pretrained`), vLLM and SGLang can serve the
result. With `fp8=True`, every Linear weight inside the decoder layers except the
router is stored as DeepSeek-V3 block fp8 (`weight` + `weight_scale_inv`, 128x128
blocks) and `quantization_config` says so, as in the DeepSeek-V3 release; embeddings,
norms, router and lm_head stay in `dtype`, the router bias in float32.

`get(path)` returns a leaf as any array that can be indexed (numpy, jax, or a lazy
`checkpoint.open_leaf` TensorStore); only `leaf[layer(, expert)]` slices are
materialized, so with a lazy `get` host memory holds one HF tensor plus one shard.
"""

from __future__ import annotations

import functools
import itertools
import json
import operator
import os
from collections.abc import Callable

import jax
import numpy as np
from safetensors.numpy import save_file

from composer_jax.hf import config_map, names, quant
from composer_jax.model.config import ModelConfig

FP8_QUANTIZATION_CONFIG = {
  "quant_method": "fp8",
  "fmt": "e4m3",
  "activation_scheme": "dynamic",
  "weight_block_size": list(quant.FP8_BLOCK),
}
INDEX_FILE = "model.safetensors.index.json"


def fp8_quantized(entry: names.Entry) -> bool:
  """Whether the fp8 export (and the DeepSeek-V3 / Kimi-K2 releases) store `entry` as block
  fp8 + `weight_scale_inv`: decoder Linear weights except the router."""
  return (
    entry.base.startswith("model.layers.")
    and entry.suffix == "weight"
    and len(entry.hf_shape) == 2
    and not entry.base.endswith("mlp.gate")
  )


def leaf(variables: dict, path: names.Path) -> np.ndarray:
  """`variables[path[0]][path[1]]...`: `export_hf`'s `get` over an in-memory tree."""
  return functools.reduce(operator.getitem, path, variables)


def export_hf(
  cfg: ModelConfig,
  get: Callable[[names.Path], np.ndarray],
  out_dir: str,
  *,
  dtype: str = "bfloat16",
  fp8: bool = False,
  max_shard_bytes: int = 4 << 30,
) -> None:
  """Writes the HF checkpoint of the variables that `get(path) -> array` returns into
  `out_dir`, which must be new or empty (shards of another export would mix with these;
  `convert.outputs.staged` gives a fresh directory that replaces an old one when done).

  Raises:
    ValueError: `out_dir` is not empty, `cfg` does not export (GQA attention), or a tensor
      holds NaN/inf (the shards written before it stay: write into `convert.outputs.staged`).
  """
  hf_cfg = config_map.to_hf(
    cfg, quantization_config=FP8_QUANTIZATION_CONFIG if fp8 else None, torch_dtype=dtype
  )  # Fails before anything is written.
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise ValueError(f"{out_dir} is not empty; export into a new or empty directory")
  os.makedirs(out_dir, exist_ok=True)
  np_dtype = jax.numpy.dtype(dtype)
  by_path = itertools.groupby(
    sorted(names.entries(cfg), key=lambda e: e.path), key=lambda e: e.path
  )
  shard, shard_bytes, written, total = {}, 0, [], 0

  def flush():
    nonlocal shard, shard_bytes
    if shard:
      path = os.path.join(out_dir, f"shard-{len(written):05d}.tmp")
      save_file(shard, path, metadata={"format": "pt"})
      written.append((path, list(shard)))
      shard, shard_bytes = {}, 0

  for path, group in by_path:
    leaf = get(path)
    for entry in group:
      x = entry.to_hf(np.asarray(leaf[entry.index], np.float32))
      if not np.isfinite(x).all():  # A diverged checkpoint is not served.
        raise ValueError(
          f"{entry.name} holds NaN/inf: the checkpoint is not finite, nothing exported"
        )
      if entry.suffix == "e_score_correction_bias":
        tensors = {entry.name: x.astype(np.float32)}
      elif fp8 and fp8_quantized(entry):
        q, scale_inv = quant.quantize_fp8_block(x)
        tensors = {entry.name: q, entry.name + "_scale_inv": scale_inv}
      else:
        tensors = {entry.name: x.astype(np_dtype)}
      for name, t in tensors.items():
        shard[name] = np.ascontiguousarray(t)
        shard_bytes += t.nbytes
        total += t.nbytes
      if shard_bytes >= max_shard_bytes:
        flush()
  flush()
  weight_map = {}
  for k, (tmp, tensor_names) in enumerate(written):
    final = f"model-{k + 1:05d}-of-{len(written):05d}.safetensors"
    os.replace(tmp, os.path.join(out_dir, final))
    weight_map.update(dict.fromkeys(tensor_names, final))
  with open(os.path.join(out_dir, INDEX_FILE), "w") as f:
    json.dump(
      {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
      f,
      indent=2,
    )
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_cfg, f, indent=2)
