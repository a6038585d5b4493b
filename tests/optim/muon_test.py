"""scale_by_muon vs optax.contrib.muon on every Muon parameter kind of the model."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax import contrib

from composer_jax.model import axes as axes_lib
from composer_jax.optim import muon, newton_schulz

# One leaf per parameter kind of the model's tree (`transformer.logical_axes`; small dims),
# with its logical axes.
KINDS = {
  "q_b": ((16, 4, 12), ("q_lora", "heads", "head_dim")),  # MLA, per head
  "kv_a": ((24, 20), ("embed", "kv_lora")),
  "o": ((4, 8, 24), ("heads", "head_dim", "embed")),  # per head, head axis first
  "gqa_k": ((24, 2, 8), ("embed", "kv_heads", "head_dim")),  # batch axis in the middle
  "mlp_up": ((24, 40), ("embed", "mlp")),  # dense MLP [D, F]
  "stack_down": ((2, 40, 24), ("layers", "mlp", "embed")),  # scanned stack [L, F, D]
  "experts_gate": ((2, 3, 24, 10), ("layers", "experts", "embed", "expert_mlp")),
  "experts_down": ((2, 3, 10, 24), ("layers", "experts", "expert_mlp", "embed")),
}
AXES = {k: names for k, (_, names) in KINDS.items()}


def _tree(seed, dtype):
  rng = np.random.default_rng(seed)
  return {k: jnp.asarray(rng.standard_normal(shape), dtype) for k, (shape, _) in KINDS.items()}


def _optax_dims():
  def dims(names):
    _, (r, o) = axes_lib.muon_dims(names)
    return contrib.MuonDimensionNumbers(reduction_axis=r, output_axis=o)

  return jax.tree.map(dims, AXES, is_leaf=muon.is_axes_leaf)


@pytest.mark.parametrize(
  "scale_mode,coeffs,nesterov,dtype",
  [
    ("consistent_rms", "quintic", True, "float64"),
    ("keller", "polar_express", False, "float64"),
    ("consistent_rms", "quintic", True, "float32"),
    ("keller", "polar_express", False, "float32"),
  ],
)
def test_matches_optax_contrib_muon_over_steps(scale_mode, coeffs, nesterov, dtype):
  """Three steps of (Muon direction + decoupled weight decay) · LR vs optax.

  Compared per unit of update scale (i.e. the orthogonalized momentum, entries
  <= ~0.7). Float64 shows the math is identical (1e-10). In float32 each side is
  itself ~1e-6 (quintic) / ~3e-6 (Polar Express, coefficients up to 23) away from
  the float64 result, but the two run the same operations in the same order (one
  flat batch of matrices like optax's vmap, x / sqrt(sum x^2)), so they agree to
  1e-6 (measured on XLA:CPU: 0 for Polar Express/keller, 6e-8 for consistent_rms,
  whose scale optax rounds to float32 before multiplying).
  """
  lr, wd, beta, steps = 0.5, 0.1, 0.9, 5
  table = newton_schulz.coefficient_schedule(coeffs, steps)
  with jax.enable_x64(dtype == "float64"):
    ref_tx = contrib.muon(
      learning_rate=lr,
      ns_coeffs=tuple(map(tuple, table)),
      ns_steps=steps,
      beta=beta,
      eps=0.0,
      weight_decay=wd,
      nesterov=nesterov,
      muon_weight_dimension_numbers=_optax_dims(),
      consistent_rms=0.2 if scale_mode == "consistent_rms" else None,
    )
    tx = optax.chain(
      muon.scale_by_muon(
        AXES,
        momentum=beta,
        nesterov=nesterov,
        ns_coeffs=coeffs,
        ns_steps=steps,
        scale_mode=scale_mode,
        eps=0.0,
      ),
      optax.add_decayed_weights(wd),
      optax.scale_by_learning_rate(lr),
    )
    params = _tree(0, dtype)
    state, ref_state = jax.jit(tx.init)(params), jax.jit(ref_tx.init)(params)
    update, ref_update = jax.jit(tx.update), jax.jit(ref_tx.update)
    for step in range(3):
      grads = _tree(step + 1, dtype)
      u, state = update(grads, state, params)
      ref_u, ref_state = ref_update(grads, ref_state, params)
      for k, (shape, names) in KINDS.items():
        scale = muon.update_scale(shape, names, scale_mode) * lr
        # float32: the two NS loops round differently (ours multiplies only the Gram products'
        # upper blocks): 1.2e-6 at LLVM -O0 (tests/conftest.py), 3.7e-6 seen on one element of
        # 1,440 on an AMD EPYC with jaxlib 0.10.2. float64 holds the algorithm to 1e-10.
        atol = {"float64": 1e-10, "float32": 6e-6}[dtype]
        chex.assert_trees_all_close(
          u[k] / scale, ref_u[k] / scale, atol=atol, rtol=0, custom_message=f"{k} step {step}"
        )
      params = optax.apply_updates(params, u)


def test_update_scale_hand_values():
  # q_b [Lq=16, H=4, dh=12]: one [16, 12] matrix per head; the head axis is not a fan.
  shape, names = KINDS["q_b"]
  assert muon.fan_in_out(shape, names) == (16, 12)
  assert muon.update_scale(shape, names, "consistent_rms") == pytest.approx(0.2 * 4.0)
  assert muon.update_scale(shape, names, "keller") == 1.0
  shape, names = KINDS["experts_gate"]  # [L, E, D=24, Fe=10]
  assert muon.update_scale(shape, names, "consistent_rms") == pytest.approx(0.2 * 24**0.5)
  assert muon.update_scale(shape, names, "keller") == 1.0
  shape, names = KINDS["experts_down"]  # [L, E, Fe=10, D=24]
  assert muon.update_scale(shape, names, "keller") == pytest.approx(2.4**0.5)


def test_to_matrices_layout_and_restore():
  x = jnp.arange(24 * 2 * 8, dtype=jnp.float32).reshape(KINDS["gqa_k"][0])
  mats, restore = muon.to_matrices(x, AXES["gqa_k"])
  np.testing.assert_array_equal(mats, np.transpose(np.asarray(x), (1, 0, 2)))  # [KV, D, hd]
  np.testing.assert_array_equal(restore(mats), x)


def test_zero_and_tiny_gradients():
  """Zero gradient -> zero update (no NaN); 1e-20·G -> the update of G.

  optax.contrib (eps=1e-8 added to the norm) would shrink the tiny one to ~0.
  """
  kinds = ("q_b", "experts_gate")
  grads = {k: v for k, v in _tree(3, "float32").items() if k in kinds}
  grads = {
    "zero": jax.tree.map(jnp.zeros_like, grads),
    "tiny": jax.tree.map(lambda g: g * 1e-20, grads),
    "ref": grads,
  }
  tx = muon.scale_by_muon({case: {k: AXES[k] for k in kinds} for case in grads})
  both = jax.jit(tx.update)(grads, tx.init(grads))[0]
  for u in jax.tree.leaves(both["zero"]):
    assert np.isfinite(np.asarray(u)).all()
    np.testing.assert_array_equal(u, 0.0)
  chex.assert_trees_all_close(both["tiny"], both["ref"], atol=2e-6)


def test_bad_input_raises():
  with pytest.raises(ValueError, match="Unknown Muon update scale mode 'spectral'"):
    muon.scale_by_muon(AXES, scale_mode="spectral")
  with pytest.raises(ValueError, match="Unknown Newton-Schulz coefficients 'dion'"):
    muon.scale_by_muon(AXES, ns_coeffs="dion")
  embedding = {"embedding": jnp.ones((8, 4))}
  tx = muon.scale_by_muon({"embedding": ("vocab", "embed")})
  with pytest.raises(ValueError, match="not a Muon parameter"):
    tx.update(embedding, tx.init(embedding))
