"""Newton–Schulz orthogonalization: the approximate polar factor used by Muon.

For a matrix G = U S V^T (SVD), Muon's update direction is the polar factor
U V^T ("zeroth power" of G). It is approximated with odd matrix polynomials that
use only matmuls, so it runs fast on accelerators and in bfloat16:

    X_0     = G / ||G||_F                     (all singular values in (0, 1])
    A_k     = X_k X_k^T                       (Gram matrix of the small side)
    X_{k+1} = a_k X_k + (b_k A_k + c_k A_k^2) X_k  =  p_k(X_k),
    p_k(σ)  = a_k σ + b_k σ^3 + c_k σ^5          (acts on each singular value).

Because p_k is odd, X_k = U p(S) V^T: only the singular values change, and the
iteration pushes each of them towards 1.

Coefficient presets:
* 'quintic': (3.4445, -4.7750, 2.0315) every step — Keller Jordan's Muon
  (https://kellerjordan.github.io/posts/muon/, modded-nanogpt), tuned for the
  largest slope at 0; singular values land in roughly [0.7, 1.2], not at 1.
* 'polar_express': per-step minimax-optimal quintics from Amsel, Persson, Musco,
  Gower, "The Polar Express: Optimal Matrix Sign Methods and Their Application to
  the Muon Algorithm", arXiv:2505.16932 (2025); table `_COEFFS` of the authors'
  reference implementation github.com/NoahAmsel/PolarExpress
  `polar_express/basic.py` (commit 7f0fb57), computed by
  `optimal_composition(l=1e-3, num_iters=8, safety_factor_eps=1e-2,
  cushion=0.02)`. As there, every polynomial but the last is divided by the
  safety factor 1.01 (p(σ/1.01)), steps beyond the table repeat the last row, and
  the input is normalized by 1.01·||G||_F — here folded into the first row.

Numerics: the iteration runs in float32 (float64 only for float64 input) and
returns the input dtype. `precision` (`PRECISIONS`) trades accuracy for matmul speed:
'mixed' feeds the matmuls bfloat16 inputs with float32 accumulation and a float32
iterate; 'bfloat16' keeps the iterate in bfloat16 too (modded-nanogpt's Muon). Their
error against float32 is measured in `tests/optim/newton_schulz_test.py` and by
`experiments.bench.muon`. The
Frobenius normalization is optax's x / sqrt(sum x^2) wherever that sum is a normal
float; where it would underflow or overflow (|x| ~ 1e-20 or 1e20 in float32) it
first divides by the max-abs entry, as LAPACK's nrm2 does. So the result is scale
invariant to rounding at any scale, equals optax bit for bit at ordinary scales,
and an all-zero matrix maps to zeros instead of NaN.

The pieces (`coefficient_schedule`, `frobenius_normalize`, `newton_schulz_iterate`)
are separate pure functions so a sharded Muon can reuse them around its own
collectives.
"""

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

_QUINTIC = ((3.4445, -4.7750, 2.0315),)

_POLAR_EXPRESS_PUBLISHED = (
  (8.28721201814563, -23.595886519098837, 17.300387312530933),
  (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
  (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
  (3.3184196573706015, -2.488488024314874, 0.51004894012372),
  (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
  (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
  (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
  (1.875, -1.25, 0.375),
)
_POLAR_EXPRESS_SAFETY = 1.01


def _rescale_input(row, s: float):
  """Coefficients of σ -> p(σ / s) for p(σ) = aσ + bσ^3 + cσ^5."""
  a, b, c = row
  return (a / s, b / s**3, c / s**5)


def _polar_express_table():
  rows = [_rescale_input(r, _POLAR_EXPRESS_SAFETY) for r in _POLAR_EXPRESS_PUBLISHED[:-1]]
  rows.append(_POLAR_EXPRESS_PUBLISHED[-1])
  # The reference divides the input by 1.01·||G||_F; p_0(X / 1.01) is the same.
  rows[0] = _rescale_input(rows[0], _POLAR_EXPRESS_SAFETY)
  return tuple(rows)


COEFF_PRESETS = {"quintic": _QUINTIC, "polar_express": _polar_express_table()}

Coeffs = str | Sequence[float] | Sequence[Sequence[float]] | np.ndarray


def coefficient_schedule(coeffs: Coeffs, steps: int) -> np.ndarray:
  """Per-step (a, b, c) coefficients as a static float64 array [steps, 3].

  Args:
    coeffs: a preset name in `COEFF_PRESETS`, one (a, b, c) triple used every
      step, or a table [n, 3] whose first `steps` rows are used (the last row
      repeats when steps > n, the Polar Express convention).
    steps: number of Newton–Schulz iterations, >= 1.
  """
  if isinstance(coeffs, str):
    if coeffs not in COEFF_PRESETS:
      raise ValueError(
        f"Unknown Newton-Schulz coefficients {coeffs!r}; valid presets: "
        f"{sorted(COEFF_PRESETS)} or an array of shape [3] or [n, 3]"
      )
    coeffs = COEFF_PRESETS[coeffs]
  table = np.asarray(coeffs, dtype=np.float64)
  if table.ndim == 1:
    table = table[None]
  if table.ndim != 2 or table.shape[-1] != 3 or table.shape[0] == 0:
    raise ValueError(
      f"Newton-Schulz coefficients must have shape [3] or [n, 3], got {np.shape(coeffs)}"
    )
  if int(steps) != steps or steps < 1:
    raise ValueError(f"Newton-Schulz steps must be a positive integer, got {steps!r}")
  idx = np.minimum(np.arange(steps), table.shape[0] - 1)
  return table[idx]


def compute_dtype(dtype) -> jnp.dtype:
  """float32, or float64 for float64 inputs (used by the exactness tests)."""
  return jnp.promote_types(dtype, jnp.float32)


# Below this squared norm the plain sum of squares could lose precision to float32
# underflow (terms < 1e-38 flush to zero), so the max-abs-rescaled path is used instead.
_MIN_PLAIN_SUMSQ = 1e-20


def frobenius_normalize(x: jax.Array, eps: float = 1e-7) -> jax.Array:
  """x / ||x||_F per trailing matrix of x [..., m, n] in `compute_dtype`, zero-safe.

  Where sum x^2 is a normal float this is optax's x / sqrt(sum x^2) op for op;
  otherwise x is divided by max|x| first and then by (norm + eps), so `eps` only
  guards the all-zero matrix and never breaks scale invariance, even for
  1e-20-sized inputs (module doc).
  """
  x = x.astype(compute_dtype(x.dtype))
  sumsq = jnp.sum(jnp.square(x), axis=(-2, -1), keepdims=True)
  amax = jnp.max(jnp.abs(x), axis=(-2, -1), keepdims=True)
  y = x / jnp.maximum(amax, jnp.finfo(x.dtype).tiny)
  rescaled = y / (jnp.sqrt(jnp.sum(jnp.square(y), axis=(-2, -1), keepdims=True)) + eps)
  safe = jnp.isfinite(sumsq) & (sumsq >= _MIN_PLAIN_SUMSQ)
  return jnp.where(safe, x / jnp.sqrt(sumsq), rescaled)


# precision -> (matmul input dtype, iterate dtype); None = the input's compute dtype.
PRECISIONS = {
  "float32": (None, None),
  "mixed": (jnp.bfloat16, None),
  "bfloat16": (jnp.bfloat16, jnp.bfloat16),
}


def check_precision(precision: str) -> None:
  """One-line ValueError for a name not in `PRECISIONS`."""
  if precision not in PRECISIONS:
    raise ValueError(f"Unknown Newton-Schulz precision {precision!r}; valid: {sorted(PRECISIONS)}")


# `symmetric_product` halves a product while each half of x [h, n] keeps at least this many
# rows and entries: smaller products run below XLA:CPU's matmul rate, and then the saved
# FLOPs no longer pay for the blocks' copies (RESULTS.md 2026-12-07).
MIN_BLOCK_ROWS = 64
MIN_BLOCK_ENTRIES = 2**16


def symmetric_product(x: jax.Array, y: jax.Array, times_transposed) -> jax.Array:
  """X Y^T [..., m, m] of x, y [..., m, n] whose product is symmetric (Y = X, or X = cY with Y
  symmetric), with the blocks below the diagonal copied instead of multiplied.

  With X = [X1; X2] and Y = [Y1; Y2] split at h = m // 2 rows,

      X Y^T = [[X1 Y1^T, X1 Y2^T], [(X1 Y2^T)^T, X2 Y2^T]],

  and the diagonal blocks recurse while h >= `MIN_BLOCK_ROWS` and h n >= `MIN_BLOCK_ENTRIES`:
  a BLAS SYRK done with plain products, at 3/4 of the full product's FLOPs for one split and
  5/8 for two. `times_transposed(a, b)` is the product a b^T [..., p, q] of a [..., p, n] and
  b [..., q, n].
  """
  m, n = x.shape[-2:]
  h = m // 2
  if h < MIN_BLOCK_ROWS or h * n < MIN_BLOCK_ENTRIES:
    return times_transposed(x, y)
  x1, x2, y1, y2 = x[..., :h, :], x[..., h:, :], y[..., :h, :], y[..., h:, :]
  corner = times_transposed(x1, y2)  # [..., h, m - h]
  top = jnp.concatenate([symmetric_product(x1, y1, times_transposed), corner], axis=-1)
  bottom = jnp.concatenate(
    [jnp.swapaxes(corner, -1, -2), symmetric_product(x2, y2, times_transposed)], axis=-1
  )
  return jnp.concatenate([top, bottom], axis=-2)


def newton_schulz_iterate(x: jax.Array, table: np.ndarray, precision: str = "float32") -> jax.Array:
  """Applies X <- aX + (bA + cA^2)X, A = X X^T, for each row of `table` [steps, 3].

  A tall X (m > n) is iterated as X^T (p(X^T) = p(X)^T), so the Gram matrix is always the
  small [min(m, n)]^2 one; it is transposed once before the loop and once after, in the
  iterate's dtype. A and A^2 = A A^T are symmetric and multiplied by `symmetric_product`.

  Args:
    x: [..., m, n] float32 (or float64) with singular values <= 1 (e.g. from
      `frobenius_normalize`).
    table: static per-step coefficients from `coefficient_schedule`.
    precision: a `PRECISIONS` name (module doc); the result has x's dtype.
  """
  check_precision(precision)
  in_dtype, state_dtype = PRECISIONS[precision]
  state_dtype = state_dtype or x.dtype
  in_dtype = in_dtype or x.dtype
  acc = compute_dtype(in_dtype)
  batch, col = tuple(range(x.ndim - 2)), x.ndim - 1

  # Accumulated in float32 (float64) and then rounded to the iterate's dtype, as a bfloat16
  # GEMM does anyway; asked for so, XLA:CPU runs a 2-D bfloat16 product natively instead of
  # converting its operands to float32 first.
  def times_transposed(a, b):  # a b^T, contracting the columns of both: no copy of b^T
    dims = (((col,), (col,)), (batch, batch))
    out = jax.lax.dot_general(
      a.astype(in_dtype), b.astype(in_dtype), dims, preferred_element_type=acc
    )
    return out.astype(state_dtype)

  def step(x, abc):
    a, b, c = abc[0], abc[1], abc[2]
    gram = symmetric_product(x, x, times_transposed)
    # c A A, multiplied in optax's order (cA) A; A^T = A.
    poly = b * gram + symmetric_product(c * gram, gram, times_transposed)
    update = jnp.matmul(poly.astype(in_dtype), x.astype(in_dtype), preferred_element_type=acc)
    return a * x + update.astype(state_dtype), None

  tall = x.shape[-2] > x.shape[-1]
  y = x.astype(state_dtype)
  y = jnp.swapaxes(y, -1, -2) if tall else y
  # A scan (not an unrolled loop) compiles the products once per shape.
  y = jax.lax.scan(step, y, jnp.asarray(table, state_dtype))[0]
  y = jnp.swapaxes(y, -1, -2) if tall else y
  return y.astype(x.dtype)


# `batch_elements=-1` (the run config's default): on CPU, chunks of at most 64K matrix
# entries, so every matrix that size or larger goes alone. XLA:CPU runs a lone bfloat16
# product natively, at about twice its float32 rate on CPUs with bfloat16 dot instructions,
# but converts a batched Gram product X X^T to float32 first. Smaller matrices share a chunk,
# which pays for the per-op cost (RESULTS.md 2026-12-06). On GPU/TPU: all matrices at once
# (not measured there).
CPU_BATCH_ELEMENTS = 2**16


def resolve_batch_elements(batch_elements: int) -> int:
  """`orthogonalize`'s chunk budget: an int >= 0 as is; -1 per backend (CPU:
  `CPU_BATCH_ELEMENTS`; GPU/TPU: 0, all matrices at once)."""
  if isinstance(batch_elements, bool) or not isinstance(batch_elements, int) or batch_elements < -1:
    raise ValueError(
      f"Newton-Schulz batch_elements must be an int >= 0 (0: all matrices at once) or -1 "
      f"(per backend), got {batch_elements!r}"
    )
  if batch_elements == -1:
    return CPU_BATCH_ELEMENTS if jax.default_backend() == "cpu" else 0
  return batch_elements


def orthogonalize(
  x: jax.Array,
  coeffs: Coeffs = "quintic",
  steps: int = 5,
  eps: float = 1e-7,
  precision: str = "float32",
  batch_elements: int = -1,
) -> jax.Array:
  """Approximate polar factor U V^T of every trailing matrix of x [..., m, n].

  Leading axes are independent matrices (batched matmuls; `batch_elements` chunks). Tall
  matrices (m > n) are iterated as their transposes (`newton_schulz_iterate`), so the Gram
  matrix is [min(m, n)]^2 either way.

  Args:
    x: [..., m, n] array of any float dtype.
    coeffs: see `coefficient_schedule`.
    steps: number of iterations.
    eps: see `frobenius_normalize`.
    precision: matmul / iterate precision (`PRECISIONS`, module doc).
    batch_elements: > 0: the matrices go through in chunks of at most this many entries
      (at least one matrix each; `lax.map`), which bounds the temporaries and, on CPU,
      keeps the working set in cache; the result is the same. 0: all at once; -1: per
      backend (`resolve_batch_elements`).

  Returns:
    [..., m, n] in x.dtype, computed in float32 (float64 for float64 input) unless
    `precision` says otherwise.
  """
  if x.ndim < 2:
    raise ValueError(f"orthogonalize needs an array [..., m, n] of rank >= 2, got shape {x.shape}")
  table = coefficient_schedule(coeffs, steps)
  batch_elements = resolve_batch_elements(batch_elements)
  y = x.reshape((-1,) + x.shape[-2:])  # one flat batch axis [B, m, n]

  def run(z):  # [..., m, n] -> [..., m, n]
    return newton_schulz_iterate(frobenius_normalize(z, eps), table, precision)

  chunk = max(1, batch_elements // math.prod(y.shape[1:])) if batch_elements else y.shape[0]
  if chunk == 1:
    # One matrix at a time, as a 2-D array: XLA:CPU multiplies X X^T in place.
    y = jax.lax.map(run, y)
  elif chunk < y.shape[0]:
    y = jax.lax.map(lambda z: run(z[None])[0], y, batch_size=chunk)
  else:
    y = run(y)
  return y.reshape(x.shape).astype(x.dtype)
