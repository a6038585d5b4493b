"""Muon (MomentUm Orthogonalized by Newton–Schulz) at the model's own granularity.

For each Muon parameter W with gradient G_t (step t = 1, 2, ...), momentum β:

    M_t   = β M_{t-1} + (1 - β) G_t                               (EMA momentum)
    N_t   = β M_t / (1 - β^{t+1}) + (1 - β) G_t / (1 - β^t)       (Nesterov, bias-corrected)
            or M_t / (1 - β^t) without Nesterov
    O_t   = NS(N_t)                 ≈ U V^T for N_t = U S V^T, per independent matrix
    U_t   = s(fan_in, fan_out) · O_t

with the update scale s:
* 'consistent_rms' (Moonlight; Liu et al., "Muon is Scalable for LLM Training",
  arXiv:2502.16982): 0.2 · sqrt(max(fan_in, fan_out)), which gives the
  update the RMS ≈ 0.2 of a typical AdamW update so AdamW's LR and weight decay
  carry over;
* 'keller' (Jordan, https://kellerjordan.github.io/posts/muon/):
  sqrt(max(1, fan_out / fan_in)).

The learning rate and decoupled weight decay are applied outside (see
`composer_jax.optim.builder`): W <- W - η_t (U_t + λ W).

Granularity comes from the logical-axis table (`composer_jax.model.axes`): axes
named 'layers', 'experts', 'heads', 'kv_heads' index independent matrices (one NS
per layer / expert / head), and the two MATRIX axes are (reduction = fan-in,
output = fan-out), kernels being stored input-first. Fan-in/out exclude batch
axes, e.g. q_b [Lq, H, dh] is H matrices [Lq, dh]. The matrix axes are moved
last (batch axes keep their order) and Newton–Schulz runs on one flat batch of
matrices. This per-leaf form is for one device; on a mesh the trainer uses
`composer_jax.optim.sharded_muon`, built from the same pieces (`muon_transform`,
`scaled_direction`).

Conventions follow `optax.contrib.scale_by_muon` + `optax.contrib.scale_by_shape`
(optax 0.2.8) exactly, down to the order of operations: the bias-corrected
Nesterov form above, coefficient tables, x / ||x||_F, one flat batch of matrices
(optax vmaps); the tests match it to 1e-10 in float64 and to 1e-6 of the update
scale in float32 (measured: <= 6e-8). Differences: our Gram products A = X X^T and
A^2 multiply only the blocks on and above the diagonal of large matrices
(`newton_schulz.symmetric_product`; the same values, summed in other blocks);
our Frobenius normalization stays scale invariant for tiny or huge gradients
(optax adds eps=1e-8 to the norm, which shrinks updates of tiny gradients), and
coefficients are static config rather than optimizer state. The un-corrected
form of Keller Jordan and Moonlight (N_t = β M_t + (1-β) G_t) differs only in
the relative weight of M_t and G_t during the first ~1/(1-β) steps, since NS
discards the overall scale.
"""

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from composer_jax.model import axes as axes_lib
from composer_jax.optim import newton_schulz

SCALE_MODES = ("consistent_rms", "keller")
MOONLIGHT_RMS = 0.2


class MuonState(NamedTuple):
  """count: int32 [] steps taken; mu: momentum tree (MaskedNode where not Muon)."""

  count: jax.Array
  mu: optax.Updates


def fan_in_out(shape: Sequence[int], names: tuple[str, ...]) -> tuple[int, int]:
  """(fan_in, fan_out) of one matrix of a Muon parameter: the two MATRIX axes' sizes."""
  _, (r, o) = axes_lib.muon_dims(names)
  return shape[r], shape[o]


def update_scale(shape: Sequence[int], names: tuple[str, ...], mode: str) -> float:
  """Static multiplier s(fan_in, fan_out) of the orthogonalized update (see module doc)."""
  fan_in, fan_out = fan_in_out(shape, names)
  if mode == "consistent_rms":
    return MOONLIGHT_RMS * math.sqrt(max(fan_in, fan_out))
  if mode == "keller":
    return math.sqrt(max(1.0, fan_out / fan_in))
  raise ValueError(f"Unknown Muon update scale mode {mode!r}; valid: {SCALE_MODES}")


def to_matrices(
  x: jax.Array, names: tuple[str, ...]
) -> tuple[jax.Array, Callable[[jax.Array], jax.Array]]:
  """Moves the (fan_in, fan_out) axes last: x -> [*batch, fan_in, fan_out], and its inverse.

  Batch axes keep their relative order. Returns (matrices, restore).
  """
  if x.ndim != len(names):
    raise ValueError(f"Array of shape {x.shape} does not match logical axes {names}")
  batch, (r, o) = axes_lib.muon_dims(names)
  perm = batch + (r, o)
  inverse = tuple(perm.index(i) for i in range(x.ndim))
  return jnp.transpose(x, perm), lambda y: jnp.transpose(y, inverse)


def is_axes_leaf(x: Any) -> bool:
  """`is_leaf` for logical-axes trees, whose leaves are tuples of names (pytree nodes)."""
  return isinstance(x, tuple) and all(isinstance(n, str) for n in x)


def _is_masked(x: Any) -> bool:
  return isinstance(x, optax.MaskedNode)


def map_muon_leaves(
  fn: Callable[[jax.Array, tuple[str, ...]], Any], tree: Any, logical_axes: Any
) -> Any:
  """fn(leaf, names) on every array leaf of `tree`; MaskedNode leaves pass through.

  `logical_axes` has the structure of `tree` (it may also be the full tree when
  `tree` is masked by `optax.partition`), with tuples of names as leaves.
  """
  return jax.tree.map(
    lambda x, names: x if _is_masked(x) else fn(x, names), tree, logical_axes, is_leaf=_is_masked
  )


def momentum_step(
  updates: optax.Updates, state: MuonState, beta: float, nesterov: bool
) -> tuple[optax.Updates, MuonState]:
  """(N_t, next state): the elementwise momentum of the module doc, any tree (MaskedNode ok)."""
  mu = optax.tree.update_moment(updates, state.mu, beta, 1)
  count = optax.safe_increment(state.count)
  if nesterov:
    m_hat = jax.tree.map(
      lambda m, g: beta * m + (1 - beta) * g,
      optax.tree.bias_correction(mu, beta, optax.safe_increment(count)),
      optax.tree.bias_correction(updates, beta, count),
    )
  else:
    m_hat = optax.tree.bias_correction(mu, beta, count)
  return m_hat, MuonState(count=count, mu=mu)


def checked_table(scale_mode: str, ns_coeffs: newton_schulz.Coeffs, ns_steps: int) -> np.ndarray:
  """The static NS coefficient table [ns_steps, 3]; raises early on a bad mode or table."""
  if scale_mode not in SCALE_MODES:
    raise ValueError(f"Unknown Muon update scale mode {scale_mode!r}; valid: {SCALE_MODES}")
  return newton_schulz.coefficient_schedule(ns_coeffs, ns_steps)


def scaled_direction(
  o: jax.Array, shape: Sequence[int], names: tuple[str, ...], mode: str, dtype
) -> jax.Array:
  """U_t = s(fan_in, fan_out) · O_t in the update dtype (O_t rounded to it first)."""
  return (update_scale(shape, names, mode) * o.astype(dtype)).astype(dtype)


def muon_transform(
  directions: Callable[[optax.Updates], optax.Updates], momentum: float, nesterov: bool
) -> optax.GradientTransformation:
  """Momentum (`momentum_step`) followed by `directions(N_t) -> U_t` on the whole tree.

  The one Muon skeleton: `scale_by_muon` orthogonalizes leaf by leaf, the sharded
  Muon (`composer_jax.optim.sharded_muon`) by shape groups across the tree.
  """

  def init_fn(params):
    return MuonState(count=jnp.zeros([], jnp.int32), mu=optax.tree.zeros_like(params))

  def update_fn(updates, state, params=None):
    del params
    m_hat, state = momentum_step(updates, state, momentum, nesterov)
    return directions(m_hat), state

  return optax.GradientTransformation(init_fn, update_fn)


def scale_by_muon(
  logical_axes: Any,
  *,
  momentum: float = 0.95,
  nesterov: bool = True,
  ns_coeffs: newton_schulz.Coeffs = "quintic",
  ns_steps: int = 5,
  scale_mode: str = "consistent_rms",
  eps: float = 1e-7,
  ns_precision: str = "float32",
  ns_batch_elements: int = -1,
) -> optax.GradientTransformation:
  """Muon direction U_t (module doc) for every leaf; no learning rate, no weight decay.

  Args:
    logical_axes: tree like the params with tuples of logical axis names as
      leaves; every leaf that reaches this transform must satisfy
      `axes.uses_muon` (use `optax.partition` for mixed trees).
    momentum: β.
    nesterov: bias-corrected Nesterov momentum (module doc) or plain EMA.
    ns_coeffs, ns_steps, eps: see `newton_schulz.orthogonalize`.
    scale_mode: one of SCALE_MODES.
    ns_precision: Newton–Schulz matmul precision (`newton_schulz.PRECISIONS`).
    ns_batch_elements: `newton_schulz.orthogonalize`'s `batch_elements` (-1: per
      backend, `newton_schulz.resolve_batch_elements`).

  Returns:
    An optax GradientTransformation with state `MuonState`.
  """
  table = checked_table(scale_mode, ns_coeffs, ns_steps)
  newton_schulz.check_precision(ns_precision)
  budget = newton_schulz.resolve_batch_elements(ns_batch_elements)

  def direction(m_hat, names):
    mats, restore = to_matrices(m_hat, names)
    o = restore(newton_schulz.orthogonalize(mats, table, len(table), eps, ns_precision, budget))
    return scaled_direction(o, m_hat.shape, names, scale_mode, m_hat.dtype)

  return muon_transform(
    lambda m_hat: map_muon_leaves(direction, m_hat, logical_axes), momentum, nesterov
  )
