"""Streaming reader for Hugging Face safetensors checkpoints (one tensor at a time).

The safetensors numpy backend cannot return BF16 or F8_E4M3 tensors (numpy has no
such dtypes), so this reader parses the documented safetensors header itself and
memory-maps each tensor's byte range with the matching `ml_dtypes` dtype: opening a
directory reads only the JSON headers, and `get(name)` touches only that tensor's
bytes. `weight(base)` resolves a logical Linear weight stored plain, block-fp8 or
packed-int4 (see `quant`) and returns it dequantized to float32 `[out, in]`.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import struct

import ml_dtypes
import numpy as np

from composer_jax.hf import quant

DTYPES = {
  "F64": np.dtype(np.float64),
  "F32": np.dtype(np.float32),
  "F16": np.dtype(np.float16),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
  "I64": np.dtype(np.int64),
  "I32": np.dtype(np.int32),
  "I16": np.dtype(np.int16),
  "I8": np.dtype(np.int8),
  "U8": np.dtype(np.uint8),
  "BOOL": np.dtype(np.bool_),
}
FP8_SCALE_SUFFIX = "_scale_inv"  # X.weight (fp8) + X.weight_scale_inv
INT4_SUFFIXES = ("weight_packed", "weight_scale", "weight_shape")


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  file: str
  dtype: str  # safetensors dtype string, e.g. "BF16"
  shape: tuple[int, ...]
  start: int  # absolute byte offset in `file`
  end: int


@dataclasses.dataclass(frozen=True)
class StoredWeight:
  """How one logical weight is stored: `form` in {'plain', 'fp8', 'int4'}."""

  base: str  # e.g. "model.layers.0.mlp.gate_proj"
  form: str
  names: tuple[str, ...]  # every tensor that makes up this weight
  shape: tuple[int, ...]  # logical (dequantized) shape


INDEX_FILE = "model.safetensors.index.json"


def read_header(path: str) -> dict[str, TensorInfo]:
  """Parses one .safetensors header: 8-byte little-endian length, then JSON.

  Raises a one-line ValueError naming `path` when the file is empty, its header is cut or
  not JSON, or it is shorter than its header says (a truncated download).
  """
  size = os.path.getsize(path)
  if size == 0:
    raise ValueError(f"{path}: empty file (0 bytes), not a safetensors shard; re-download it")
  with open(path, "rb") as f:
    head = f.read(8)
    n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
    if n is None or 8 + n > size:
      raise ValueError(
        f"{path}: safetensors header cut short (file has {size} bytes"
        f"{'' if n is None else f', header says {8 + n}'}); re-download it"
      )
    try:
      header = json.loads(f.read(n))
    except ValueError as e:
      raise ValueError(
        f"{path}: safetensors header is not valid JSON ({e}); re-download it"
      ) from None
  header.pop("__metadata__", None)
  out = {}
  for name, h in header.items():
    if h["dtype"] not in DTYPES:
      raise ValueError(
        f"{path}: tensor {name!r} has unsupported dtype {h['dtype']!r}; supported: {sorted(DTYPES)}"
      )
    s, e = h["data_offsets"]
    out[name] = TensorInfo(path, h["dtype"], tuple(h["shape"]), 8 + n + s, 8 + n + e)
  end = max((i.end for i in out.values()), default=8 + n)
  if end > size:
    raise ValueError(
      f"{path}: truncated: its header describes {end} bytes, the file has {size}; re-download it"
    )
  return out


def _indexed_shards(hf_dir: str) -> list[str]:
  """Shard paths named by `model.safetensors.index.json` (none if there is no index).

  Raises a one-line error for an unreadable index, a shard name that is not a file name in
  `hf_dir` (a path such as '../x' would read outside it), or a named shard that is missing.
  """
  index = os.path.join(hf_dir, INDEX_FILE)
  if not os.path.exists(index):
    return []
  try:
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{index}: not a safetensors index (JSON with a weight_map): {e!r}") from None
  if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
    raise ValueError(f"{index}: weight_map must be a JSON object of tensor name -> shard file name")
  shards = sorted(set(weight_map.values()))
  for shard in shards:
    if os.path.basename(shard) != shard or shard in ("", ".", ".."):
      raise ValueError(
        f"{index} names shard {shard!r}, not a file name in {hf_dir}; shards "
        "must lie in the checkpoint directory itself"
      )
    if not os.path.isfile(os.path.join(hf_dir, shard)):
      tensors = [t for t, s in weight_map.items() if s == shard]
      raise FileNotFoundError(
        f"{index} names shard {shard!r} ({len(tensors)} tensors, e.g. "
        f"{tensors[0]!r}), but {os.path.join(hf_dir, shard)} is missing; "
        "download it"
      )
  return [os.path.join(hf_dir, s) for s in shards]


class SafetensorsDir:
  """All tensors of an HF checkpoint directory, by name; data is read lazily."""

  def __init__(self, hf_dir: str):
    files = sorted(
      set(glob.glob(os.path.join(hf_dir, "*.safetensors"))) | set(_indexed_shards(hf_dir))
    )
    if not files:
      raise FileNotFoundError(f"No *.safetensors files in {hf_dir!r}")
    self.infos: dict[str, TensorInfo] = {}
    for path in files:
      for name, info in read_header(path).items():
        if name in self.infos:
          raise ValueError(f"Tensor {name!r} appears in both {self.infos[name].file} and {path}")
        self.infos[name] = info

  def __contains__(self, name: str) -> bool:
    return name in self.infos

  def get(self, name: str) -> np.ndarray:
    """One tensor, memory-mapped read-only (copy it before keeping it)."""
    if name not in self.infos:
      raise KeyError(f"Tensor {name!r} not found in the checkpoint")
    i = self.infos[name]
    dtype = DTYPES[i.dtype]
    count = int(np.prod(i.shape, dtype=np.int64))
    if count == 0:
      return np.zeros(i.shape, dtype)
    return np.memmap(i.file, dtype=dtype, mode="r", offset=i.start, shape=i.shape)

  def resolve(self, base: str, suffix: str = "weight") -> StoredWeight | None:
    """Finds how tensor `base.suffix` is stored, from headers only (None if absent).

    Only `suffix == "weight"` (Linear weights) may be stored quantized.
    """
    w = f"{base}.{suffix}"
    if w in self.infos:
      if self.infos[w].dtype == "F8_E4M3":
        if w + FP8_SCALE_SUFFIX not in self.infos:
          raise ValueError(f"fp8 tensor {w!r} has no block scale {w + FP8_SCALE_SUFFIX!r}")
        return StoredWeight(base, "fp8", (w, w + FP8_SCALE_SUFFIX), self.infos[w].shape)
      return StoredWeight(base, "plain", (w,), self.infos[w].shape)
    if suffix != "weight":
      return None
    names = tuple(f"{base}.{s}" for s in INT4_SUFFIXES)
    present = [n in self.infos for n in names]
    if not any(present):
      return None
    if not all(present):
      raise ValueError(
        f"int4 weight {base!r} needs all of {list(names)}; missing "
        f"{[n for n, p in zip(names, present) if not p]}"
      )
    if f"{base}.weight_zero_point" in self.infos:
      raise ValueError(
        f"int4 weight {base!r} has a weight_zero_point: asymmetric "
        "pack-quantized weights are not supported (only symmetric)"
      )
    shape = tuple(int(d) for d in self.get(names[2]))
    return StoredWeight(base, "int4", names, shape)

  def weight(self, stored: StoredWeight) -> np.ndarray:
    """The logical weight as float32 (dequantized when stored quantized)."""
    if stored.form == "plain":
      return np.asarray(self.get(stored.names[0]), np.float32)
    if stored.form == "fp8":
      return quant.dequantize_fp8_block(self.get(stored.names[0]), self.get(stored.names[1]))
    packed, scale, _ = (self.get(n) for n in stored.names)
    return quant.dequantize_int4_packed(np.asarray(packed), np.asarray(scale), stored.shape)
