"""fp8 block / packed int4 (de)quantization vs hand-written scalar references."""

import math

import chex
import ml_dtypes
import numpy as np
import pytest

from composer_jax.hf import quant


def _ref_dequant_fp8(q, scale_inv, block):
  """Element by element: w[i, j] = float(q[i, j]) * scale_inv[i // bo, j // bi]."""
  out = np.zeros(q.shape, np.float64)
  for i in range(q.shape[0]):
    for j in range(q.shape[1]):
      out[i, j] = float(q[i, j]) * float(scale_inv[i // block[0], j // block[1]])
  return out


def _ref_dequant_int4(packed, scale, shape):
  """Bit by bit: nibble k of packed[i, c] is q + 8 of column 8c + k; w = q * scale."""
  out_dim, in_dim = shape
  group = in_dim // scale.shape[1]
  w = np.zeros(shape, np.float64)
  for i in range(out_dim):
    for j in range(in_dim):
      word = int(packed[i, j // 8]) & 0xFFFFFFFF
      q = ((word >> (4 * (j % 8))) & 0xF) - 8
      w[i, j] = q * float(scale[i, j // group])
  return w


@pytest.mark.parametrize(
  "shape,block", [((40, 72), (16, 32)), ((128, 256), (128, 128)), ((130, 260), (128, 128))]
)
def test_fp8_block_roundtrip(shape, block):
  w = np.random.default_rng(0).normal(0, 0.05, shape).astype(np.float32)
  q, scale_inv = quant.quantize_fp8_block(w, block)
  assert q.dtype == ml_dtypes.float8_e4m3fn
  assert scale_inv.shape == tuple(math.ceil(d / b) for d, b in zip(shape, block))
  deq = quant.dequantize_fp8_block(q, scale_inv, block)
  np.testing.assert_array_equal(deq, _ref_dequant_fp8(q, scale_inv, block).astype(np.float32))
  # e4m3 has 3 mantissa bits: rounding error <= 2^-4 relative, or half the subnormal
  # spacing 2^-9 (times the block scale) near zero.
  scale = np.repeat(np.repeat(scale_inv, block[0], 0), block[1], 1)[: shape[0], : shape[1]]
  assert np.all(np.abs(deq - w) <= np.abs(w) / 16 + scale * 2.0**-10)


@pytest.mark.parametrize("shape,group", [((6, 64), 32), ((3, 40), 8), ((5, 36), 4)])
def test_int4_packed_roundtrip(shape, group):
  w = np.random.default_rng(1).normal(0, 0.05, shape).astype(np.float32)
  packed, scale, wshape = quant.quantize_int4_packed(w, group)
  assert packed.dtype == np.int32 and packed.shape == (shape[0], math.ceil(shape[1] / 8))
  assert tuple(wshape) == shape and scale.shape == (shape[0], shape[1] // group)
  deq = quant.dequantize_int4_packed(packed, scale, tuple(wshape))
  chex.assert_trees_all_close(
    deq, _ref_dequant_int4(packed, scale, shape).astype(np.float32), atol=0, rtol=1e-7
  )
  step = np.repeat(scale, group, axis=1)
  assert np.all(np.abs(deq - w) <= step / 2 + 1e-7)  # round to nearest, amax maps to 7.5 steps


def test_int4_known_packing():
  """Hand-packed word: columns 0..7 hold q = -8, -7, ..., -1 -> nibbles 0..7."""
  word = sum(k << (4 * k) for k in range(8))
  packed = np.array([[word]], np.int64).astype(np.uint32).view(np.int32)
  deq = quant.dequantize_int4_packed(packed, np.ones((1, 1), np.float32), (1, 8))
  np.testing.assert_array_equal(deq, np.arange(-8, 0, dtype=np.float32)[None])


@pytest.mark.parametrize(
  "call,match",
  [
    (
      lambda: quant.dequantize_fp8_block(
        np.zeros((4, 4), ml_dtypes.float8_e4m3fn), np.ones((2, 2), np.float32)
      ),
      "weight_scale_inv shape",
    ),
    (
      lambda: quant.dequantize_int4_packed(np.zeros((2, 2), np.int32), np.ones((2, 1)), (2, 8)),
      "num_bits=4",
    ),
    (
      lambda: quant.dequantize_int4_packed(np.zeros((2, 1), np.int32), np.ones((2, 3)), (2, 8)),
      "weight_scale shape",
    ),
  ],
)
def test_bad_quantized_shapes(call, match):
  with pytest.raises(ValueError, match=match):
    call()
