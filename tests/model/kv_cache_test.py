"""KV cache: buffers, writes and masks by hand; cached decoding equals the full forward."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.model import kv_cache, transformer
from composer_jax.model.config import get_preset
from tests.model.random_variables import random_variables

_CFG = get_preset("tiny", num_layers=2)  # one dense + one MoE layer


@pytest.mark.parametrize(
  "attention, shapes",
  [
    ("mla", {"latent": (3, 10, 32 + 8)}),  # compressed latent + rope key, not per-head K/V
    ("gqa", {"k": (3, 10, 2, 16), "v": (3, 10, 2, 16)}),
  ],
)
def test_init_shapes(attention, shapes):
  cfg = _CFG.replace(attention=attention, num_layers=3, dtype="bfloat16")
  cache = kv_cache.init(cfg, batch=3, max_len=10)
  assert set(cache) == {"dense_layers", "moe_layers"}
  for stack, n in (("dense_layers", 1), ("moe_layers", 2)):
    got = {k: (v.shape, v.dtype) for k, v in cache[stack].items()}
    assert got == {k: ((n,) + s, jnp.bfloat16) for k, s in shapes.items()}
  assert set(kv_cache.init(cfg.replace(first_k_dense_replace=0), 1, 4)) == {"moe_layers"}


def test_init_rejects_too_long():
  with pytest.raises(ValueError, match="max_position_embeddings"):
    kv_cache.init(_CFG.replace(max_position_embeddings=8), 1, 9)


def test_write_and_mask_by_hand():
  buf = jnp.zeros((2, 5, 1))
  new = jnp.array([[[1.0], [2.0]], [[3.0], [4.0]]])
  got = kv_cache.write(buf, new, jnp.array([[0, 1], [3, 4]]))
  want = np.zeros((2, 5, 1))
  want[0, :2, 0], want[1, 3:, 0] = [1, 2], [3, 4]
  chex.assert_trees_all_equal(got, jnp.asarray(want))
  m = kv_cache.mask(jnp.array([[1], [3]]), 5)
  chex.assert_trees_all_equal(m, jnp.asarray([[[[1, 1, 0, 0, 0]]], [[[1, 1, 1, 1, 0]]]], bool))


@pytest.mark.parametrize("attention", ["mla", "gqa"])
def test_chunked_decode_equals_forward(attention):
  """Prefill 6 tokens, then 1, then 1 more through one cache == one full forward."""
  cfg = _CFG.replace(attention=attention)
  variables = random_variables(cfg)
  tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, cfg.vocab_size)
  want, _ = jax.jit(transformer.forward, static_argnums=0)(cfg, variables, tokens)
  decode = jax.jit(transformer.decode, static_argnums=0)
  cache = kv_cache.init(cfg, 2, 8)
  got = []
  for lo, hi in ((0, 6), (6, 7), (7, 8)):
    pos = jnp.broadcast_to(jnp.arange(lo, hi), (2, hi - lo))
    h, cache = decode(cfg, variables, tokens[:, lo:hi], pos, cache)
    got.append(h)
  chex.assert_trees_all_close(jnp.concatenate(got, 1), want, atol=2e-5, rtol=1e-5)


def test_decode_needs_positions():
  variables = jax.eval_shape(lambda: transformer.init(_CFG, jax.random.key(0)))
  with pytest.raises(ValueError, match="explicit positions"):
    jax.eval_shape(
      lambda v: transformer.Transformer(_CFG).apply(
        v, jnp.zeros((1, 2), jnp.int32), cache=kv_cache.init(_CFG, 1, 4)
      ),
      variables,
    )
