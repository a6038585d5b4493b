"""Context parallelism: zig-zag layout by hand, full model vs unsharded, gathered HLO operand."""

import functools
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from composer_jax.model import transformer
from composer_jax.model.attention import attention_mask
from composer_jax.model.config import get_preset
from composer_jax.parallel import context, context_mesh
from composer_jax.parallel.mesh import default_mesh_config, make_meshes
from composer_jax.parallel.rules import default_rules, param_shardings
from composer_jax.train import placement

_CFG = get_preset("tiny", num_layers=1, first_k_dense_replace=0)  # one (dropless) MoE layer
_B, _L = 4, 16


def _mesh(cp: int):
  return make_meshes(default_mesh_config(fsdp=-1, context=cp))


def test_zigzag_order_by_hand_and_round_trip():
  # 8 tokens, CP 2: chunks [0 1] [2 3] [4 5] [6 7]; rank 0 holds chunks 0, 3; rank 1 chunks 1, 2.
  np.testing.assert_array_equal(context.zigzag_order(8, 2), [0, 1, 6, 7, 2, 3, 4, 5])
  np.testing.assert_array_equal(context.zigzag_order(8, 1), np.arange(8))
  x = np.random.default_rng(0).standard_normal((3, 24, 5), dtype=np.float32)
  for cp in (1, 2, 3, 4):
    z = context.zigzag(x, cp, axis=1)
    assert sorted(z[0, :, 0]) == sorted(x[0, :, 0]) and not (cp > 1 and np.array_equal(z, x))
    np.testing.assert_array_equal(context.unzigzag(z, cp, axis=1), x)
    np.testing.assert_array_equal(context.unzigzag(jnp.asarray(z), cp, axis=1), x)


@pytest.mark.parametrize("cp", [2, 4])
def test_zigzag_balances_causal_work(cp):
  length = 32
  c = length // (2 * cp)
  order = context.zigzag_order(length, cp)
  mask = np.asarray(attention_mask(jnp.ones((1, length), jnp.int32), order))[0, 0]
  # The zig-zag mask is the causal mask with rows and columns permuted the same way.
  np.testing.assert_array_equal(mask, np.tril(np.ones((length, length), bool))[order][:, order])
  pairs = mask.reshape(cp, length // cp, length).sum((1, 2))  # attended pairs per rank
  # By hand: query t attends t + 1 keys; chunk j sums to c * j * c + c (c + 1) / 2; rank r
  # holds chunks r and 2 CP - 1 - r.
  np.testing.assert_array_equal(pairs, [c * c * (2 * cp - 1) + c * (c + 1)] * cp)
  contiguous = np.tril(np.ones((length, length), bool)).reshape(cp, -1, length).sum((1, 2))
  assert contiguous[-1] > contiguous[0]  # what the zig-zag order fixes


def _packed_batch(rng) -> dict:
  """Two documents per row (random split), then padding; positions restart per document."""
  segs, pos = np.zeros((_B, _L), np.int32), np.zeros((_B, _L), np.int32)
  for b in range(_B):
    a, n = rng.integers(3, _L // 2), rng.integers(3, _L // 2)
    segs[b, :a], segs[b, a : a + n] = 1, 2
    pos[b, :a], pos[b, a : a + n] = np.arange(a), np.arange(n)
  return dict(
    tokens=rng.integers(0, _CFG.vocab_size, (_B, _L)).astype(np.int32),
    targets=rng.integers(0, _CFG.vocab_size, (_B, _L)).astype(np.int32),
    segment_ids=segs,
    positions=pos,
    loss_mask=(segs != 0).astype(np.float32),
  )


def _loss_and_logits(cfg):
  """`(params, router, batch) -> ((CE token sum, logits [B, L, V]), d CE / d params)`."""

  def f(params, router, batch):
    hidden, _ = transformer.forward(
      cfg,
      {"params": params, "router": router},
      batch["tokens"],
      batch["segment_ids"],
      batch["positions"],
    )
    logits = hidden @ transformer.output_head(cfg, params)
    ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], -1)
    return (ce[..., 0] * batch["loss_mask"]).sum(), logits

  return jax.value_and_grad(f, has_aux=True)


@functools.cache
def _unsharded(attention):
  """(cfg, variables, batch, ((loss, logits), grads)) on one device, rows in order."""
  cfg = _CFG.replace(attention=attention)
  variables = transformer.init(cfg, jax.random.key(0))
  batch = _packed_batch(np.random.default_rng(0))
  return (
    cfg,
    variables,
    batch,
    jax.jit(_loss_and_logits(cfg))(variables["params"], variables["router"], batch),
  )


# (gqa, 4) is left out to keep the test time down: it adds nothing (mla, 4) and (gqa, 2) miss.
@pytest.mark.parametrize("attention, cp", [("mla", 2), ("gqa", 2), ("mla", 4)])
def test_model_equals_unsharded(attention, cp):
  cfg, variables, batch, ((want_loss, want_logits), want_grads) = _unsharded(attention)
  fn = _loss_and_logits(cfg)
  dm = _mesh(cp)
  shardings = param_shardings(
    transformer.logical_axes(cfg)["params"], dm, default_rules(), shapes=variables["params"]
  )
  params = jax.device_put(variables["params"], shardings)
  _, eval_sharding = placement.batch_shardings(dm, default_rules())
  sharded_batch = placement.to_global(batch, eval_sharding)  # zig-zag order, seq over context
  assert sharded_batch["tokens"].sharding.spec[1] == "context"
  (loss, logits), grads = jax.jit(context_mesh.with_mesh(dm, default_rules(), fn))(
    params, variables["router"], sharded_batch
  )

  chex.assert_trees_all_close(loss, want_loss, rtol=1e-5)
  chex.assert_trees_all_close(context.unzigzag(logits, cp, axis=1), want_logits, atol=1e-5)
  chex.assert_trees_all_close(grads, want_grads, atol=1e-5, rtol=1e-5)


def test_mla_gathers_the_latent_not_kv():
  cfg = _CFG.replace(first_k_dense_replace=1)  # attention + dense MLP only
  variables = transformer.init(cfg, jax.random.key(0))
  dm = make_meshes(default_mesh_config(fsdp=1, context=2), jax.devices()[:2])
  tokens = jax.device_put(
    jnp.zeros((2, _L), jnp.int32), NamedSharding(dm.dense, PartitionSpec(None, "context"))
  )
  fwd = context_mesh.with_mesh(dm, default_rules(), lambda v, t: transformer.forward(cfg, v, t)[0])
  hlo = jax.jit(fwd).lower(variables, tokens).compile().as_text()  # params replicated
  gathered = re.findall(r"= f32\[([\d,]+)\]\{[^}]*\} all-gather(?:-start)?\(", hlo)
  latent = cfg.kv_lora_rank + cfg.qk_rope_head_dim
  # One latent all-gather `[B, L, r + dr]` per layer (in the scanned body), nothing else.
  assert gathered and all(s == f"2,{_L},{latent}" for s in gathered), gathered
  kv = cfg.num_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
  assert latent < kv  # floats per token: the latent gathered vs the K/V it replaces


def test_sequence_not_divisible_by_2cp_raises():
  with pytest.raises(
    ValueError, match="seq_len=12 is not divisible by 2 \\* context parallelism = 8"
  ):
    context.zigzag_order(12, 4)
  dm = _mesh(4)
  variables = jax.eval_shape(lambda: transformer.init(_CFG, jax.random.key(0)))
  with (
    context_mesh.use_mesh(dm, default_rules()),
    pytest.raises(ValueError, match="seq_len=12 is not divisible"),
  ):
    jax.eval_shape(lambda v: transformer.forward(_CFG, v, jnp.zeros((2, 12), jnp.int32)), variables)


def test_rules_must_shard_the_sequence_over_context():
  rules = default_rules()
  rules.dense = [("seq", None)] + [r for r in rules.dense if r[0] != "seq"]
  variables = jax.eval_shape(lambda: transformer.init(_CFG, jax.random.key(0)))
  with (
    context_mesh.use_mesh(_mesh(2), rules),
    pytest.raises(
      ValueError,
      match="needs the dense rule 'seq' -> 'context'; the layout's rules shard the "
      "sequence over None",
    ),
  ):
    jax.eval_shape(lambda v: transformer.forward(_CFG, v, jnp.zeros((2, _L), jnp.int32)), variables)
