"""Transformer: parameter tree, causality, packing, scan compile cost, remat, inputs."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.model import axes, transformer
from composer_jax.model.config import get_preset

_CFG = get_preset("tiny", num_layers=2)  # one dense + one MoE layer
_is_names = lambda x: isinstance(x, tuple)


@pytest.fixture(scope="module")
def variables():
  return transformer.init(_CFG, jax.random.key(0))


def test_init_tree_matches_logical_axes(variables):
  names = transformer.logical_axes(_CFG)
  shapes = jax.tree.map(lambda x: x.shape, variables)
  chex.assert_trees_all_equal_structs(
    jax.tree.map(lambda n: 0, names, is_leaf=_is_names), jax.tree.map(lambda x: 0, variables)
  )
  jax.tree.map(lambda n, s: chex.assert_equal(len(n), len(s)), names, shapes, is_leaf=_is_names)
  jax.tree.map(lambda x: chex.assert_type(x, jnp.float32), variables)
  p, d, e = names["params"], _CFG.hidden_size, _CFG.n_routed_experts
  assert p["moe_layers"]["moe"]["experts"]["gate"] == ("layers", "experts", "embed", "expert_mlp")
  assert names["router"]["moe_layers"]["moe"]["bias"] == ("layers", "router")
  assert shapes["params"]["moe_layers"]["moe"]["router"]["kernel"] == (1, d, e)
  assert shapes["params"]["lm_head"]["kernel"] == (d, _CFG.vocab_size)
  muon = [n for n in jax.tree.leaves(names, is_leaf=_is_names) if axes.uses_muon(n)]
  assert ("layers", "heads", "head_dim", "embed") in muon  # attention output


def test_tied_head_and_dtypes():
  cfg = _CFG.replace(tie_word_embeddings=True, dtype="bfloat16")
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  assert "lm_head" not in shapes["params"]
  table = jnp.arange(6.0).reshape(3, 2)
  chex.assert_trees_all_equal(
    transformer.output_head(cfg, {"embed": {"embedding": table}}), table.T
  )
  hidden, aux = jax.eval_shape(
    lambda v: transformer.forward(cfg, v, jnp.zeros((2, 4), int)), shapes
  )
  assert hidden.dtype == jnp.bfloat16 and aux["router_counts"].dtype == jnp.float32


@pytest.mark.parametrize("attention", ["mla", "gqa"])
def test_causal_and_packed_equals_separate(attention):
  cfg = _CFG.replace(attention=attention)
  variables = transformer.init(cfg, jax.random.key(1))
  fwd = jax.jit(lambda t, s=None, p=None: transformer.forward(cfg, variables, t, s, p))
  rng = np.random.default_rng(0)
  doc_a, doc_b = rng.integers(0, cfg.vocab_size, 5), rng.integers(0, cfg.vocab_size, 7)
  packed = jnp.asarray(np.concatenate([doc_a, doc_b]))[None]
  segs = jnp.asarray([[1] * 5 + [2] * 7])
  pos = jnp.asarray([list(range(5)) + list(range(7))])
  h, aux = fwd(packed, segs, pos)

  # Doc A alone (default segments/positions); doc B alone, followed by padding.
  h_a, aux_a = jax.jit(lambda t: transformer.forward(cfg, variables, t))(jnp.asarray(doc_a)[None])
  junk = rng.integers(0, cfg.vocab_size, 5)
  h_b, aux_b = fwd(
    jnp.asarray(np.concatenate([doc_b, junk]))[None],
    jnp.asarray([[1] * 7 + [0] * 5]),
    jnp.asarray([list(range(12))]),
  )
  chex.assert_trees_all_close(h[0, :5], h_a[0], atol=1e-5)
  chex.assert_trees_all_close(h[0, 5:], h_b[0, :7], atol=1e-5)
  # Padding is excluded from router counts.
  chex.assert_trees_all_close(aux["router_counts"], aux_a["router_counts"] + aux_b["router_counts"])
  assert float(aux["router_counts"].sum()) == 12 * cfg.num_experts_per_tok
  assert bool(jnp.all(jnp.isfinite(h_b)))

  # Changing tokens at and after index 8 never changes outputs before it.
  changed = packed.at[0, 8:].set((packed[0, 8:] + 1) % cfg.vocab_size)
  h2, _ = fwd(changed, segs, pos)
  chex.assert_trees_all_close(h2[0, :8], h[0, :8], atol=1e-6)
  assert float(jnp.abs(h2[0, 8:] - h[0, 8:]).max()) > 1e-3


def _hlo_lines(num_layers: int, remat_policy: str) -> int:
  cfg = _CFG.replace(num_layers=num_layers, remat_policy=remat_policy, scan_layers=True)
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  tokens = jax.ShapeDtypeStruct((2, 8), jnp.int32)

  def loss(v, t):
    hidden, aux = transformer.forward(cfg, v, t)
    return jnp.sum(hidden) + aux["balance_loss"]

  return len(jax.jit(jax.grad(loss)).lower(shapes, tokens).as_text().splitlines())


def test_scan_compile_cost_does_not_grow_with_depth():
  # 2 vs 8 MoE layers (a length-1 scan lowers slightly differently, so start at 2).
  shallow, deep = _hlo_lines(3, "full"), _hlo_lines(9, "full")
  assert deep <= shallow * 1.02, (shallow, deep)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["full", "dots", "dots_no_batch"])
def test_remat_policies_keep_gradients(variables, policy):
  tokens = jnp.asarray(np.random.default_rng(3).integers(0, _CFG.vocab_size, (2, 8)))

  def grads(cfg):
    loss = lambda v: jnp.sum(jnp.sin(transformer.forward(cfg, v, tokens)[0]))
    return jax.jit(jax.grad(loss))(variables)

  chex.assert_trees_all_close(
    grads(_CFG.replace(remat_policy=policy)), grads(_CFG), rtol=1e-5, atol=1e-6
  )


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(tokens=jnp.zeros((2, 4))), "integer"),
    (dict(tokens=jnp.zeros((4,), int)), "integer"),
    (dict(segment_ids=jnp.ones((2, 3), int)), "segment_ids shape"),
    (dict(positions=jnp.ones((1, 4), int)), "positions shape"),
  ],
)
def test_bad_inputs_raise(variables, kwargs, match):
  args = dict(tokens=jnp.zeros((2, 4), int), segment_ids=None, positions=None) | kwargs
  with pytest.raises(ValueError, match=match):
    jax.eval_shape(lambda v: transformer.forward(_CFG, v, **args), variables)
