"""Newton–Schulz orthogonalization vs numpy SVD and vs optax.contrib."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from optax.contrib import _muon as optax_muon

from composer_jax.optim import newton_schulz

# Singular-value bands after 5 steps: Keller's quintic oscillates in ~[0.68, 1.13];
# Polar Express (5 of its 8 tuned steps) in ~[0.87, 1.13], and converges by 8 steps.
BANDS = {
  ("quintic", 5): (0.65, 1.2),
  ("polar_express", 5): (0.85, 1.15),
  ("polar_express", 8): (1 - 1e-4, 1 + 1e-4),
}


def _random_matrices(shape, seed=0):
  """[..., m, n] float32 with known SVD: singular values log-spaced in [0.05, 1]."""
  rng = np.random.default_rng(seed)
  *batch, m, n = shape
  k = min(m, n)
  u, _ = np.linalg.qr(rng.standard_normal((*batch, m, k)))
  v, _ = np.linalg.qr(rng.standard_normal((*batch, n, k)))
  s = np.geomspace(0.05, 1.0, k) * rng.uniform(0.5, 2.0, (*batch, 1))
  return ((u * s[..., None, :]) @ np.swapaxes(v, -1, -2)).astype(np.float32)


@pytest.mark.parametrize("coeffs,steps", sorted(BANDS))
@pytest.mark.parametrize(
  "shape",
  [(16, 16), (8, 24), (24, 8), (4, 12, 6), (2, 3, 10, 14)],
  ids=["square", "wide", "tall", "per_head", "per_expert"],
)
def test_output_is_polar_factor_with_singular_values_in_band(shape, coeffs, steps):
  x = _random_matrices(shape)
  out = np.asarray(newton_schulz.orthogonalize(jnp.asarray(x), coeffs, steps), np.float64)
  chex.assert_shape(out, shape)
  u, _, vt = np.linalg.svd(x.astype(np.float64), full_matrices=False)
  # out = U f(S) V^T with the SAME singular vectors as x: U^T out V is diagonal.
  core = np.swapaxes(u, -1, -2) @ out @ np.swapaxes(vt, -1, -2)
  diag = np.diagonal(core, axis1=-2, axis2=-1)
  off = core - diag[..., None] * np.eye(core.shape[-1])
  np.testing.assert_array_less(np.abs(off), 1e-4)
  lo, hi = BANDS[(coeffs, steps)]
  sv = np.linalg.svd(out, compute_uv=False)
  assert lo <= sv.min() and sv.max() <= hi, (sv.min(), sv.max())


@pytest.mark.parametrize(
  "coeffs,steps", [("quintic", 5), ("polar_express", 5), ("polar_express", 3)]
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(12, 20), (20, 12)], ids=["wide", "tall"])
def test_matches_optax_contrib(coeffs, steps, dtype, shape):
  """Same math as optax: equal to 1e-10 in float64; 1e-6 in float32.

  In float32 both sides are ~1e-6 (quintic) to ~3e-6 (Polar Express, whose
  coefficients reach 23) away from the float64 result, but they run the same
  operations in the same order (a [1, m, n] batch like optax's vmap, x / sqrt(sum x^2)),
  so they agree far closer than that (bit for bit on XLA:CPU). A tall matrix: both
  transpose it, but XLA sums its products in another order, so in float32 they agree only
  to that float32 error (measured: <= 2.1e-6).
  """
  with jax.enable_x64(dtype == "float64"):
    x = jnp.asarray(np.random.default_rng(1).standard_normal(shape), dtype)
    table = newton_schulz.coefficient_schedule(coeffs, steps)
    ref = optax_muon.orthogonalize_via_newton_schulz(x, jnp.asarray(table, dtype), steps, eps=0.0)
    out = newton_schulz.orthogonalize(x, coeffs, steps, eps=0.0)
    chex.assert_type(out, dtype)
    atol = {"float64": 1e-10, "float32": 1e-6 if shape[0] < shape[1] else 3e-6}[dtype]
    chex.assert_trees_all_close(out, ref, atol=atol, rtol=0)


def _count_products(fn, *args):
  return str(jax.make_jaxpr(fn)(*args)).count("dot_general")


@pytest.mark.parametrize(
  "shape,products",
  # [512, 1024]: halved while a half holds >= 64 rows and 64K entries, 3 times: 8 diagonal
  # blocks and 7 corners. [301, 600]: once (150 x 600), not again (75 x 600 < 64K).
  [((2, 512, 1024), 15), ((301, 600), 3), ((100, 600), 1)],
  ids=["three_splits", "odd_rows_one_split", "too_few_rows"],
)
def test_symmetric_product_equals_the_full_product(shape, products):
  """X X^T and (cA) A^T (A symmetric) vs numpy's full products, float64."""

  def times_transposed(a, b):
    return jnp.einsum("...pk,...qk->...pq", a, b)

  with jax.enable_x64(True):
    x = jnp.asarray(np.random.default_rng(0).standard_normal(shape))
    gram = newton_schulz.symmetric_product(x, x, times_transposed)
    want = np.asarray(x) @ np.swapaxes(np.asarray(x), -1, -2)
    np.testing.assert_allclose(gram, want, rtol=0, atol=1e-11 * np.abs(want).max())
    sq = newton_schulz.symmetric_product(-4.775 * gram, gram, times_transposed)
    want_sq = -4.775 * want @ want
    np.testing.assert_allclose(sq, want_sq, rtol=0, atol=1e-11 * np.abs(want_sq).max())
    assert (
      _count_products(lambda y: newton_schulz.symmetric_product(y, y, times_transposed), x)
      == products
    )


@pytest.mark.parametrize("dtype,atol", [("float64", 1e-10), ("float32", 1e-6)])
@pytest.mark.parametrize("shape", [(512, 1024), (1024, 512)], ids=["wide", "tall"])
def test_split_gram_products_match_optax_contrib(shape, dtype, atol):
  """Matrices large enough for `symmetric_product` to split both Gram products (X X^T into
  64-row blocks, A^2 into 128-row ones) still equal optax's full products (measured: 1e-15 in
  float64, 7e-7 in float32)."""
  with jax.enable_x64(dtype == "float64"):
    x = jnp.asarray(np.random.default_rng(1).standard_normal(shape), dtype)
    table = newton_schulz.coefficient_schedule("polar_express", 5)
    ref = optax_muon.orthogonalize_via_newton_schulz(x, jnp.asarray(table, dtype), 5, eps=0.0)
    out = newton_schulz.orthogonalize(x, "polar_express", 5, eps=0.0)
    chex.assert_trees_all_close(out, ref, atol=atol, rtol=0)
    # 15 products for X X^T, 7 for A^2, 1 for (bA + cA^2) X; optax: 3.
    assert _count_products(lambda y: newton_schulz.orthogonalize(y, steps=1), x) == 23


def test_zero_matrix_gives_zeros_and_batch_members_are_independent():
  x = _random_matrices((3, 6, 9))
  x[1] = 0.0
  out = np.asarray(newton_schulz.orthogonalize(jnp.asarray(x)))
  assert np.isfinite(out).all()
  np.testing.assert_array_equal(out[1], 0.0)
  single = newton_schulz.orthogonalize(jnp.asarray(x[2]))
  chex.assert_trees_all_close(out[2], single, atol=1e-6)


@pytest.mark.parametrize("scale", [1e-20, 1e-30, 1e20])
def test_scale_invariance(scale):
  x = _random_matrices((8, 12))
  ref = newton_schulz.orthogonalize(jnp.asarray(x))
  out = newton_schulz.orthogonalize(jnp.asarray(x * np.float32(scale)))
  chex.assert_trees_all_close(out, ref, atol=2e-6)


def test_returns_input_dtype():
  x = jnp.asarray(_random_matrices((8, 12)), jnp.bfloat16)
  out = newton_schulz.orthogonalize(x)
  chex.assert_type(out, jnp.bfloat16)
  ref = newton_schulz.orthogonalize(x.astype(jnp.float32))
  chex.assert_trees_all_close(out.astype(jnp.float32), ref, atol=1e-2)


def test_coefficient_schedule_hand_values():
  np.testing.assert_array_equal(
    newton_schulz.coefficient_schedule("quintic", 3), [[3.4445, -4.7750, 2.0315]] * 3
  )
  table = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
  np.testing.assert_array_equal(
    newton_schulz.coefficient_schedule(table, 3), [[1, 2, 3], [4, 5, 6], [4, 5, 6]]
  )
  pe = newton_schulz.coefficient_schedule("polar_express", 10)
  # Rows 0..6 carry the 1.01 safety factor (row 0 twice: input normalization too).
  s = 1.01
  np.testing.assert_allclose(
    pe[0], [8.28721201814563 / s**2, -23.595886519098837 / s**6, 17.300387312530933 / s**10]
  )
  np.testing.assert_allclose(
    pe[1], [4.107059111542203 / s, -2.9478499167379106 / s**3, 0.5448431082926601 / s**5]
  )
  np.testing.assert_array_equal(pe[7:], [[1.875, -1.25, 0.375]] * 3)


@pytest.mark.parametrize(
  "coeffs,steps,match",
  [
    ("cubic", 5, "Unknown Newton-Schulz coefficients 'cubic'"),
    ([1.0, 2.0], 5, r"shape \[3\] or \[n, 3\]"),
    ([[1.0, 2.0, 3.0, 4.0]], 5, r"shape \[3\] or \[n, 3\]"),
    ("quintic", 0, "positive integer"),
  ],
)
def test_bad_coefficients_raise(coeffs, steps, match):
  with pytest.raises(ValueError, match=match):
    newton_schulz.orthogonalize(jnp.ones((4, 4)), coeffs, steps)


def test_vector_input_raises():
  with pytest.raises(ValueError, match="rank >= 2"):
    newton_schulz.orthogonalize(jnp.ones((4,)))


# Measured relative Frobenius error vs float32 on these matrices: mixed 0.017, bfloat16 0.047.
@pytest.mark.parametrize("precision,bound", [("mixed", 0.03), ("bfloat16", 0.08)])
@pytest.mark.parametrize("batch_elements", [0, 32 * 64], ids=["all_at_once", "one_at_a_time"])
def test_low_precision_error_vs_float32_is_bounded(precision, bound, batch_elements):
  x = jnp.asarray(_random_matrices((4, 32, 64)))
  want = newton_schulz.orthogonalize(x, batch_elements=0)
  got = newton_schulz.orthogonalize(x, precision=precision, batch_elements=batch_elements)
  assert got.dtype == x.dtype
  err = np.linalg.norm(got - want, axis=(-2, -1)) / np.linalg.norm(want, axis=(-2, -1))
  assert err.max() < bound
  low, high = BANDS[("quintic", 5)]  # still Muon's singular-value band
  s = np.linalg.svd(np.asarray(got), compute_uv=False)
  assert low < s.min() and s.max() < high


def test_bad_precision_raises():
  with pytest.raises(ValueError, match="precision 'fp8'"):
    newton_schulz.orthogonalize(jnp.ones((4, 4)), precision="fp8")


# 'mixed' is left out: XLA may keep excess precision where it rounds to bfloat16 (its default
# `xla_allow_excess_precision`), and where it does depends on the program around; its error
# vs float32 in chunks is bounded in `test_low_precision_error_vs_float32_is_bounded`.
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize(
  "shape,budget",
  [
    ((7, 16, 24), 16 * 24),
    ((7, 24, 16), 16 * 24),
    ((7, 16, 24), 3 * 16 * 24),
    ((2, 5, 24, 16), 2 * 16 * 24 + 1),
  ],
  ids=["one_at_a_time", "tall_one_at_a_time", "chunks_of_3_and_a_remainder", "tall_chunks_of_2"],
)
def test_chunked_equals_all_at_once(shape, budget, precision):
  """`batch_elements` changes how many matrices one batched NS holds, not the result."""
  x = jnp.asarray(_random_matrices(shape))
  whole = newton_schulz.orthogonalize(x, precision=precision, batch_elements=0)
  chunked = newton_schulz.orthogonalize(x, precision=precision, batch_elements=budget)
  chex.assert_trees_all_close(chunked, whole, atol=1e-6, rtol=0)
  loops = {  # the chunks are a loop around NS's own
    b: jax.jit(lambda y, b=b: newton_schulz.orthogonalize(y, batch_elements=b))
    .lower(x)
    .as_text()
    .count("stablehlo.while")
    for b in (0, budget)
  }
  assert loops[budget] > loops[0], loops


def test_chunks_bound_the_temporary_memory():
  """48 matrices [256, 512]: all at once vs 4 at a time (XLA's temp buffer)."""
  x = jax.ShapeDtypeStruct((48, 256, 512), jnp.float32)
  temp = {
    b: jax.jit(lambda y, b=b: newton_schulz.orthogonalize(y, batch_elements=b))
    .lower(x)
    .compile()
    .memory_analysis()
    .temp_size_in_bytes
    for b in (0, 4 * 256 * 512)
  }
  leaf = 48 * 256 * 512 * 4
  assert temp[0] > leaf  # the whole batch's iterate and Gram matrices (measured: 1.5x)
  assert temp[4 * 256 * 512] < temp[0] / 2, temp  # measured: 0.25x


def test_batch_elements_per_backend_and_bad_values():
  assert newton_schulz.resolve_batch_elements(-1) == newton_schulz.CPU_BATCH_ELEMENTS  # CPU
  assert newton_schulz.resolve_batch_elements(0) == 0
  for bad in (-2, 1.5, "auto", True):
    with pytest.raises(ValueError, match="batch_elements must be an int >= 0"):
      newton_schulz.orthogonalize(jnp.ones((2, 4, 4)), batch_elements=bad)
