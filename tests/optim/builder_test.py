"""build_optimizer: Muon leaves vs optax.contrib.muon, AdamW leaves vs optax.adamw."""

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from optax import contrib

from composer_jax.model import axes as axes_lib
from composer_jax.optim import builder, muon
from composer_jax.parallel import rules
from composer_jax.parallel.mesh import make_meshes
from experiments.configs import layouts

# A miniature of the model's parameter tree (`transformer.logical_axes`): (shape, logical axes)
# per leaf.
LEAVES = {
  "embed": {"embedding": ((32, 16), ("vocab", "embed"))},
  "moe_layers": {
    "attn_norm": {"scale": ((2, 16), ("layers", "norm"))},
    "attn": {
      "q_b": {"kernel": ((2, 8, 2, 6), ("layers", "q_lora", "heads", "head_dim"))},
      "o": {"kernel": ((2, 2, 6, 16), ("layers", "heads", "head_dim", "embed"))},
    },
    "moe": {
      "router": {"kernel": ((2, 16, 3), ("layers", "embed", "router"))},
      "experts": {"gate": ((2, 3, 16, 8), ("layers", "experts", "embed", "expert_mlp"))},
    },
  },
  "final_norm": {"scale": ((16,), ("norm",))},
  "lm_head": {"kernel": ((16, 32), ("embed", "vocab"))},
}
_is_spec = lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], tuple)
AXES = jax.tree.map(lambda s: s[1], LEAVES, is_leaf=_is_spec)
MUON_PATHS = {
  ("moe_layers", "attn", "q_b", "kernel"),
  ("moe_layers", "attn", "o", "kernel"),
  ("moe_layers", "moe", "experts", "gate"),
}


def _cfg(**kw):
  base = dict(
    name="muon",
    lr=0.02,
    adam_lr=3e-3,
    schedule="cosine",
    warmup_steps=1,
    total_steps=10,
    min_lr_ratio=0.1,
    wsd_decay_fraction=0.2,
    weight_decay=0.1,
    b1=0.9,
    b2=0.95,
    eps=1e-8,
    momentum=0.95,
    nesterov=True,
    ns_coeffs="quintic",
    ns_steps=5,
    muon_scale="consistent_rms",
    grad_clip=0.0,
  )
  return ml_collections.ConfigDict({**base, **kw})


def _tree(seed, scale=1.0):
  rng = np.random.default_rng(seed)
  return jax.tree.map(
    lambda s: jnp.asarray(scale * rng.standard_normal(s[0]), jnp.float32), LEAVES, is_leaf=_is_spec
  )


def _flat(tree):
  leaves = jax.tree.leaves_with_path(tree, is_leaf=muon.is_axes_leaf)
  return {tuple(k.key for k in path): v for path, v in leaves}


def _run(tx, grads_seq, params):
  state, update, out = tx.init(params), jax.jit(tx.update), []
  for grads in grads_seq:
    u, state = update(grads, state, params)
    out.append(u)
    params = optax.apply_updates(params, u)
  return out


def _sched(peak, cfg):  # independent of composer_jax.optim.schedules
  return optax.warmup_cosine_decay_schedule(
    0.0, peak, cfg.warmup_steps, cfg.total_steps, peak * cfg.min_lr_ratio
  )


def _split(tree):
  """(muon subtree, adamw subtree) as flat dicts keyed by path."""
  flat = _flat(tree)
  return (
    {k: v for k, v in flat.items() if k in MUON_PATHS},
    {k: v for k, v in flat.items() if k not in MUON_PATHS},
  )


def _adamw_ref(cfg, adam_axes):
  return optax.adamw(
    _sched(cfg.adam_lr, cfg),
    b1=cfg.b1,
    b2=cfg.b2,
    eps=cfg.eps,
    weight_decay=cfg.weight_decay,
    mask={k: "norm" not in names for k, names in adam_axes.items()},
  )


def test_param_labels():
  labels = _flat(builder.param_labels(_cfg(), AXES))
  assert {k for k, v in labels.items() if v == "muon"} == MUON_PATHS
  assert set(labels.values()) == {"muon", "adamw"}
  assert set(jax.tree.leaves(builder.param_labels(_cfg(name="adamw"), AXES))) == {"adamw"}


def test_groups_match_optax_muon_and_adamw():
  cfg = _cfg()
  params, grads_seq = _tree(0), [_tree(s) for s in (1, 2, 3)]
  got = [_flat(u) for u in _run(builder.build_optimizer(cfg, AXES), grads_seq, params)]

  muon_axes, adam_axes = _split(AXES)
  dims = {
    k: contrib.MuonDimensionNumbers(*axes_lib.muon_dims(names)[1]) for k, names in muon_axes.items()
  }
  muon_ref = contrib.muon(
    _sched(cfg.lr, cfg),
    beta=cfg.momentum,
    weight_decay=cfg.weight_decay,
    nesterov=cfg.nesterov,
    muon_weight_dimension_numbers=dims,
    consistent_rms=0.2,
  )
  adam_ref = _adamw_ref(cfg, adam_axes)
  want_muon = _run(muon_ref, [_split(g)[0] for g in grads_seq], _split(params)[0])
  want_adam = _run(adam_ref, [_split(g)[1] for g in grads_seq], _split(params)[1])
  for step, (g, wm, wa) in enumerate(zip(got, want_muon, want_adam)):
    # Float32 NS rounding is ~2e-6 per unit of lr·scale (= 0.02·0.8 here; see muon_test).
    chex.assert_trees_all_close(
      {k: g[k] for k in wm}, wm, atol=2e-6 * 0.02 * 0.8, rtol=0, custom_message=f"muon step {step}"
    )
    chex.assert_trees_all_close(
      {k: g[k] for k in wa}, wa, atol=1e-9, rtol=1e-6, custom_message=f"adamw step {step}"
    )


def test_sharded_params_use_sharded_muon_with_the_same_updates():
  """With multi-device shardings the Muon group is the all-to-all Muon; same updates."""
  layout = layouts.get_config("fsdp")
  shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s[0], jnp.float32), LEAVES, is_leaf=_is_spec)
  shardings = rules.param_shardings(AXES, make_meshes(layout.mesh), layout.rules, shapes=shapes)
  cfg, params, grads_seq = _cfg(), _tree(0), [_tree(s) for s in (1, 2)]
  tx = builder.build_optimizer(cfg, AXES, shardings)
  assert "all_to_all" in jax.jit(tx.update).lower(grads_seq[0], tx.init(params), params).as_text()
  got = _run(
    tx, [jax.device_put(g, shardings) for g in grads_seq], jax.device_put(params, shardings)
  )
  want = _run(builder.build_optimizer(cfg, AXES), grads_seq, params)
  chex.assert_trees_all_close(got, want, atol=1e-5 * 0.02 * 0.8, rtol=0)
  for u, s in zip(jax.tree.leaves(got[-1]), jax.tree.leaves(shardings)):
    assert u.sharding.is_equivalent_to(s, u.ndim)


def test_adamw_ablation_and_global_norm_clipping():
  """name='adamw' is optax.adamw on every leaf; clipping rescales by 1/||g|| first."""
  cfg = _cfg(name="adamw", grad_clip=1.0)
  params, big = _tree(0), _tree(1, scale=100.0)
  norm = np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64))) for g in jax.tree.leaves(big)))
  clipped = jax.tree.map(lambda g: g / norm, big)
  got = _flat(_run(builder.build_optimizer(cfg, AXES), [big], params)[0])
  want = _run(_adamw_ref(cfg, _flat(AXES)), [_flat(clipped)], _flat(params))[0]
  chex.assert_trees_all_close(got, want, atol=1e-9, rtol=1e-5)


def test_update_rms_by_group():
  updates = _tree(4)
  labels = builder.param_labels(_cfg(), AXES)
  muon_u, adam_u = _split(updates)
  want = {
    g: np.sqrt(np.mean(np.concatenate([np.ravel(v) for v in d.values()]) ** 2))
    for g, d in (("muon", muon_u), ("adamw", adam_u))
  }
  got = builder.update_rms_by_group(updates, labels)
  assert set(got) == set(want)
  for g in want:
    np.testing.assert_allclose(got[g], want[g], rtol=1e-5)


@pytest.mark.parametrize(
  "overrides,match",
  [
    (dict(name="sgd"), "Unknown optimizer name 'sgd'"),
    (dict(muon_scale="rms"), "Unknown Muon update scale mode 'rms'"),
    (dict(ns_coeffs="cubic"), "Unknown Newton-Schulz coefficients 'cubic'"),
    (dict(schedule="step"), "Unknown LR schedule 'step'"),
  ],
)
def test_bad_config_raises(overrides, match):
  with pytest.raises(ValueError, match=match):
    builder.build_optimizer(_cfg(**overrides), AXES)
