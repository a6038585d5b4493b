"""chunked_cross_entropy against the naive full-logits computation (values and grads)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.model.loss import chunked_cross_entropy

_B, _L, _D, _V = 2, 7, 8, 33


def _inputs():
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.standard_normal((_B, _L, _D), dtype=np.float32))
  head = jnp.asarray(rng.standard_normal((_D, _V), dtype=np.float32))
  targets = jnp.asarray(rng.integers(0, _V, (_B, _L)), jnp.int32)
  mask = jnp.asarray(rng.random((_B, _L)) < 0.7, jnp.float32)
  return hidden, head, targets, mask


def _naive(hidden, head, targets, mask, z_coef):
  logits = hidden @ head
  logp = jax.nn.log_softmax(logits)
  ce = -jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
  z = jax.scipy.special.logsumexp(logits, axis=-1) ** 2
  n = mask.sum()
  return (jnp.sum(ce * mask) + z_coef * jnp.sum(z * mask)) / n


@pytest.mark.parametrize("chunk_size,z_coef", [(4, 0.0), (5, 1e-2), (14, 1e-4), (100, 0.0)])
def test_matches_naive_values_and_grads(chunk_size, z_coef):
  hidden, head, targets, mask = _inputs()
  loss_fn = lambda h, w: chunked_cross_entropy(
    h, w, targets, mask, chunk_size=chunk_size, z_loss_coef=z_coef
  )
  (loss, metrics), grads = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(hidden, head)
  want, want_grads = jax.value_and_grad(_naive, argnums=(0, 1))(hidden, head, targets, mask, z_coef)
  chex.assert_trees_all_close(loss, want, rtol=1e-5)
  chex.assert_trees_all_close(grads, want_grads, rtol=1e-4, atol=1e-6)
  assert float(metrics["num_tokens"]) == float(mask.sum())
  chex.assert_trees_all_close(metrics["ce"], _naive(hidden, head, targets, mask, 0.0), rtol=1e-5)


def test_never_materializes_full_logits():
  hidden, head, targets, mask = _inputs()
  fn = lambda h, w: chunked_cross_entropy(h, w, targets, mask, chunk_size=4)[0]
  hlo = jax.jit(jax.grad(fn, argnums=(0, 1))).lower(hidden, head).as_text()
  assert f"{_B * _L}x{_V}xf32" not in hlo
  assert f"4x{_V}xf32" in hlo


def test_empty_mask_and_bad_input():
  hidden, head, targets, mask = _inputs()
  loss, metrics = chunked_cross_entropy(hidden, head, targets, jnp.zeros_like(mask))
  assert float(loss) == 0.0 and float(metrics["num_tokens"]) == 0.0
  with pytest.raises(ValueError, match="hidden"):
    chunked_cross_entropy(hidden, head.T, targets, mask)
  with pytest.raises(ValueError, match="chunk_size"):
    chunked_cross_entropy(hidden, head, targets, mask, chunk_size=0)
