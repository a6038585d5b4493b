"""`Linear` against a plain `einsum` of the same kernel, over several token axes."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.model.layers import Linear


@pytest.mark.parametrize(
  "in_shape, out_shape, spec",
  [
    ((6,), (5,), "blsd,df->blsf"),
    ((3, 4), (5,), "blshd,hdf->blsf"),
    ((6,), (2, 3), "blsd,dhf->blshf"),
  ],
)
def test_linear_over_token_axes_equals_einsum(in_shape, out_shape, spec):
  names = ("embed",) * len(in_shape) + ("mlp",) * len(out_shape)
  layer = Linear(in_shape, out_shape, names, 0.5, "float32", "float32")
  x = jax.random.normal(jax.random.key(0), (2, 3, 4, *in_shape))  # three token axes
  kernel = nn.unbox(layer.init(jax.random.key(1), x))["params"]["kernel"]
  g = jax.random.normal(jax.random.key(2), (2, 3, 4, *out_shape))
  ours = jax.value_and_grad(
    lambda k, x: jnp.sum(layer.apply({"params": {"kernel": k}}, x) * g), (0, 1)
  )
  ref = jax.value_and_grad(lambda k, x: jnp.sum(jnp.einsum(spec, x, k) * g), (0, 1))
  (value, grads), (ref_value, ref_grads) = ours(kernel, x), ref(kernel, x)
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  chex.assert_trees_all_close(grads, ref_grads, rtol=1e-5, atol=1e-6)
