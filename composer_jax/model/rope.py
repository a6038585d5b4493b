"""Rotary position embedding (RoPE, arXiv 2104.09864) with YaRN scaling (arXiv 2309.00071).

Matches HF transformers `DeepseekV3` exactly:

* `inverse_frequencies`: `_compute_yarn_parameters` of `modeling_rope_utils` — the
  per-frequency linear ramp between interpolated (`1 / (factor * base^(2i/d))`) and
  extrapolated (`1 / base^(2i/d)`) inverse frequencies, with the correction range from
  `beta_fast` / `beta_slow` (truncated to integers), and the cos/sin `attention_factor`
  `mscale(factor, mscale) / mscale(factor, mscale_all_dim)` (or `mscale(factor)`).
* `softmax_scale`: `DeepseekV3Attention.scaling = qk_head_dim^-0.5 * mscale(factor,
  mscale_all_dim)^2` (`yarn_apply_mscale`).
* `apply_rope`: `apply_rotary_pos_emb_interleave` (`rope_interleave=True`, the DeepSeek-V3
  checkpoint layout): input dims are rotated in interleaved pairs `(x0, x1), (x2, x3), ...`
  and the output is written de-interleaved `[x_even', x_odd']`. Queries and keys get the
  same permutation, so q.k equals the plain interleaved rotation.

The frequency tables are static (numpy, computed at trace time); only the angles
`positions * inv_freq` are traced.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from composer_jax.model.config import RopeScaling


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
  """YaRN attention temperature `0.1 * mscale * ln(scale) + 1` (1 for scale <= 1)."""
  if scale <= 1:
    return 1.0
  return 0.1 * mscale * math.log(scale) + 1.0


def inverse_frequencies(
  dim: int, theta: float, scaling: RopeScaling | None
) -> tuple[np.ndarray, float]:
  """(inv_freq float32 [dim // 2], cos/sin attention_factor) for a rotary dim `dim`."""
  exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
  pos_freqs = np.float32(theta) ** exponents
  extrapolation = (1.0 / pos_freqs).astype(np.float32)
  if scaling is None:
    return extrapolation, 1.0
  factor = scaling.factor
  interpolation = (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)

  def correction_dim(num_rotations):
    # Dimension index whose wavelength completes `num_rotations` turns over the
    # original context (YaRN eq. 17-18).
    return (
      dim
      * math.log(scaling.original_max_position_embeddings / (num_rotations * 2 * math.pi))
      / (2 * math.log(theta))
    )

  low = max(math.floor(correction_dim(scaling.beta_fast)), 0)
  high = min(math.ceil(correction_dim(scaling.beta_slow)), dim - 1)
  if low == high:
    high += 0.001  # HF: prevent a zero-width ramp.
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
  extrapolation_weight = (1 - ramp).astype(np.float32)
  inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
  if scaling.mscale and scaling.mscale_all_dim:
    attention_factor = yarn_mscale(factor, scaling.mscale) / yarn_mscale(
      factor, scaling.mscale_all_dim
    )
  else:
    attention_factor = yarn_mscale(factor)
  return inv_freq.astype(np.float32), float(attention_factor)


def softmax_scale(qk_head_dim: int, scaling: RopeScaling | None) -> float:
  """Attention logit scale `qk_head_dim^-0.5`, times `mscale(factor, mscale_all_dim)^2` (YaRN)."""
  scale = qk_head_dim**-0.5
  if scaling is not None and scaling.mscale_all_dim:
    scale *= yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2
  return scale


def rope_tables(
  positions: jax.Array, dim: int, theta: float, scaling: RopeScaling | None
) -> tuple[jax.Array, jax.Array]:
  """float32 (cos, sin), each `[B, L, dim // 2]`, scaled by the YaRN attention factor.

  Args:
    positions: `[B, L]` int32 per-document positions.
  """
  inv_freq, attention_factor = inverse_frequencies(dim, theta, scaling)
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
  return jnp.cos(angles) * attention_factor, jnp.sin(angles) * attention_factor


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates interleaved pairs of `x [B, L, H, dim]`; output de-interleaved (HF layout).

  Computed in float32, returned in `x.dtype`. `cos`, `sin`: `[B, L, dim // 2]`.
  """
  x32 = x.astype(jnp.float32)
  even, odd = x32[..., 0::2], x32[..., 1::2]
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]
  return jnp.concatenate([even * cos - odd * sin, odd * cos + even * sin], axis=-1).astype(x.dtype)
