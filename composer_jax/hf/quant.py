"""Host-side (numpy) dequantizers and quantizers for released DeepSeek/Kimi weights.

Two on-disk formats are supported, exactly as the public releases store them:

* **Block-scaled fp8** (DeepSeek-V3 / Kimi-K2 releases, `quant_method: fp8`,
  `weight_block_size: [128, 128]`): `X.weight` is float8_e4m3fn `[out, in]` and
  `X.weight_scale_inv` is float32 `[ceil(out/128), ceil(in/128)]`;
  `w[i, j] = float(weight[i, j]) * weight_scale_inv[i // 128, j // 128]`
  (DeepSeek-V3 tech report §3.3.2; edge blocks are partial).
* **Packed int4** (Kimi-K2-Thinking / K2.5, compressed-tensors `pack-quantized`,
  symmetric `strategy: group`, `num_bits: 4`): `X.weight_packed` is int32
  `[out, ceil(in/8)]`, `X.weight_scale` `[out, in/group]` (bf16), `X.weight_shape`
  int `[2] = (out, in)`. Nibble `k` (bits `4k..4k+3`, least significant first) of
  `weight_packed[i, c]` holds `q + 8` for column `8c + k`, with `q` in `[-8, 7]`;
  `w[i, j] = q[i, j] * weight_scale[i, j // group]`. Asymmetric variants (a
  `weight_zero_point` tensor) are rejected by the reader.

The quantizers are the exact inverses used for export and tests: fp8 scales are
`amax(block) / 448` (the e4m3 max), int4 scales `amax(group) / 7.5` with round-to-
nearest and clip to `[-8, 7]` (compressed-tensors' symmetric min-max observer).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

FP8_DTYPE = ml_dtypes.float8_e4m3fn
FP8_MAX = float(ml_dtypes.finfo(FP8_DTYPE).max)  # 448
FP8_BLOCK = (128, 128)
INT4_PER_INT32 = 8


def _expand_blocks(scale: np.ndarray, block: tuple[int, int], shape: tuple[int, int]) -> np.ndarray:
  """[ceil(out/bo), ceil(in/bi)] per-block scale -> [out, in] per-element scale."""
  full = np.repeat(np.repeat(scale, block[0], axis=0), block[1], axis=1)
  return full[: shape[0], : shape[1]]


def _check_2d(name: str, x: np.ndarray) -> None:
  if x.ndim != 2:
    raise ValueError(f"{name} must be a 2-D [out, in] weight, got shape {x.shape}")


def dequantize_fp8_block(
  weight: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int] = FP8_BLOCK
) -> np.ndarray:
  """fp8 `[out, in]` + float32 `[ceil(out/bo), ceil(in/bi)]` -> float32 `[out, in]`."""
  _check_2d("fp8 weight", weight)
  want = tuple(math.ceil(d / b) for d, b in zip(weight.shape, block))
  if tuple(scale_inv.shape) != want:
    raise ValueError(
      f"weight_scale_inv shape {tuple(scale_inv.shape)} does not match fp8 weight "
      f"{tuple(weight.shape)} with {block} blocks; expected {want}"
    )
  scale = _expand_blocks(np.asarray(scale_inv, np.float32), block, weight.shape)
  return np.asarray(weight).astype(np.float32) * scale


def quantize_fp8_block(
  w: np.ndarray, block: tuple[int, int] = FP8_BLOCK
) -> tuple[np.ndarray, np.ndarray]:
  """float `[out, in]` -> (fp8 `[out, in]`, float32 scale_inv `[ceil(out/bo), ceil(in/bi)]`)."""
  _check_2d("weight to quantize", w)
  w = np.asarray(w, np.float32)
  out, inp = w.shape
  nb = (math.ceil(out / block[0]), math.ceil(inp / block[1]))
  padded = np.zeros((nb[0] * block[0], nb[1] * block[1]), np.float32)
  padded[:out, :inp] = np.abs(w)
  amax = padded.reshape(nb[0], block[0], nb[1], block[1]).max(axis=(1, 3))
  # An all-zero block gets scale 1 so that 0 / scale stays 0 instead of nan.
  scale_inv = np.where(amax > 0, amax / FP8_MAX, 1.0).astype(np.float32)
  q = (w / _expand_blocks(scale_inv, block, w.shape)).astype(FP8_DTYPE)
  return q, scale_inv


def dequantize_int4_packed(
  packed: np.ndarray, scale: np.ndarray, shape: tuple[int, int]
) -> np.ndarray:
  """compressed-tensors pack-quantized int4 -> float32 `[out, in]` (format in module doc)."""
  out, inp = (int(d) for d in shape)
  if packed.dtype != np.int32 or tuple(packed.shape) != (out, math.ceil(inp / INT4_PER_INT32)):
    raise ValueError(
      f"weight_packed must be int32 [{out}, {math.ceil(inp / INT4_PER_INT32)}] "
      f"for 4-bit weight_shape {(out, inp)}, got {packed.dtype} "
      f"{tuple(packed.shape)} (only num_bits=4 is supported)"
    )
  if scale.ndim != 2 or scale.shape[0] != out or inp % scale.shape[1]:
    raise ValueError(
      f"weight_scale shape {tuple(scale.shape)} is not [{out}, in/group_size] for "
      f"weight_shape {(out, inp)}"
    )
  group = inp // scale.shape[1]
  shifts = np.arange(INT4_PER_INT32, dtype=np.int32) * 4
  nibbles = (packed[:, :, None] >> shifts) & 0xF  # [out, in/8, 8]; `& 0xF` undoes sign extension
  q = nibbles.reshape(out, -1)[:, :inp].astype(np.float32) - 8.0
  return q * np.repeat(np.asarray(scale, np.float32), group, axis=1)


def quantize_int4_packed(
  w: np.ndarray, group_size: int = 32
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """float `[out, in]` -> (int32 packed `[out, ceil(in/8)]`, float32 scale `[out, in/group]`,
  int64 weight_shape `[2]`)."""
  _check_2d("weight to quantize", w)
  w = np.asarray(w, np.float32)
  out, inp = w.shape
  if inp % group_size:
    raise ValueError(f"in_features={inp} must be a multiple of group_size={group_size}")
  groups = w.reshape(out, inp // group_size, group_size)
  amax = np.abs(groups).max(axis=-1)
  scale = np.where(amax > 0, amax / 7.5, 1.0).astype(np.float32)
  q = np.clip(np.round(groups / scale[..., None]), -8, 7).reshape(out, inp).astype(np.int32)
  cols = math.ceil(inp / INT4_PER_INT32)
  u = np.zeros((out, cols * INT4_PER_INT32), np.uint32)
  u[:, :inp] = (q + 8).astype(np.uint32)
  shifts = np.arange(INT4_PER_INT32, dtype=np.uint32) * 4
  packed = (u.reshape(out, cols, INT4_PER_INT32) << shifts).sum(axis=-1, dtype=np.uint32)
  return packed.view(np.int32), scale, np.array([out, inp], np.int64)
