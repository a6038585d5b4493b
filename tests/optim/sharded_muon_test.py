"""Sharded Muon == single-device `scale_by_muon` on the tiny model, under every layout."""

import re

import chex
import jax
import numpy as np
import optax
import pytest

from composer_jax.model import axes as axes_lib
from composer_jax.model import transformer
from composer_jax.model.config import get_preset
from composer_jax.optim import muon
from composer_jax.optim.sharded_muon import sharded_scale_by_muon
from composer_jax.parallel.mesh import make_meshes
from composer_jax.parallel.rules import param_shardings
from experiments.configs import layouts

_COLLECTIVE = re.compile(r" (all-to-all|all-gather|all-reduce|reduce-scatter|collective-permute)"
                         r"(?:-start)?\(")

# Hand count of shape groups whose matrix dims are sharded (2 all-to-alls each) for the
# tiny model. Dense view, [fan_in, fan_out] sharded over fsdp (fsdp x context in cp2_ep8):
# kv_a [64, 40]; kv_b [32, 32]; o [16, 64]; q_a + shared gate/up [64, 32]; q_b [32, 24];
# dense down [128, 64]; dense gate/up [64, 128]; shared down [32, 64] -> 8 groups, several
# padded (e.g. dense gate/up: 2 matrices over 8 devices). Expert view: none when experts
# are expert-parallel (whole matrices local); in `fsdp` the embed-sharded expert gate/up
# [64, 32] and down [32, 64] add 2. In `fsdp_tp`, shared gate/up (mlp on `tensor` too) no
# longer group with q_a -> 9; dense gate/up and down go through one all-to-all over
# fsdp x tensor each.
_SHARDED_GROUPS = {"fsdp": 10, "hsdp": 8, "fsdp_ep": 8, "cp2_ep8": 8, "fsdp_tp": 9}


@pytest.fixture(scope="module")
def tiny():
  cfg = get_preset("tiny")
  names = transformer.logical_axes(cfg)["params"]
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))["params"]
  flat, treedef = jax.tree.flatten(shapes)
  keys = jax.random.split(jax.random.key(1), len(flat))
  grads = [treedef.unflatten([jax.random.normal(jax.random.fold_in(k, step), x.shape)
                              for k, x in zip(keys, flat)]) for step in range(2)]
  labels = jax.tree.map(lambda n: "muon" if axes_lib.uses_muon(n) else "adam", names,
                        is_leaf=muon.is_axes_leaf)
  ref = optax.partition({"muon": muon.scale_by_muon(names), "adam": optax.identity()}, labels)
  state, expected = ref.init(grads[0]), []
  for g in grads:
    u, state = jax.jit(ref.update)(g, state)
    expected.append(u)
  return dict(names=names, shapes=shapes, labels=labels, grads=grads, expected=expected)


@pytest.mark.slow  # ~20-30 s per layout on 2 shared cores: one compile of the whole tree
@pytest.mark.parametrize("layout", sorted(_SHARDED_GROUPS))
def test_matches_single_device_muon(tiny, layout):
  cfg = layouts.get_config(layout)
  shardings = param_shardings(tiny["names"], make_meshes(cfg.mesh), cfg.rules,
                              shapes=tiny["shapes"])
  opt = optax.partition({"muon": sharded_scale_by_muon(tiny["names"], shardings),
                         "adam": optax.identity()}, tiny["labels"])
  grads = [jax.device_put(g, shardings) for g in tiny["grads"]]
  state = jax.jit(opt.init)(grads[0])
  update = jax.jit(opt.update).lower(grads[0], state).compile()
  for g, want in zip(grads, tiny["expected"]):  # two steps: momentum and Nesterov terms
    got, state = update(g, state)
    chex.assert_trees_all_close(got, want, atol=1e-5, rtol=1e-5)
  for (path, x), s in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(shardings)):
    assert x.sharding.is_equivalent_to(s, x.ndim), (jax.tree_util.keystr(path), x.sharding, s)
  ops = _COLLECTIVE.findall(update.as_text())
  assert ops.count("all-to-all") == 2 * _SHARDED_GROUPS[layout], ops
  assert set(ops) <= {"all-to-all"}, ops  # NS itself (and momentum, scaling) never communicate


def test_rejects_non_named_sharding():
  names = {"w": ("embed", "mlp")}
  opt = sharded_scale_by_muon(names, {"w": jax.sharding.SingleDeviceSharding(jax.devices()[0])})
  g = {"w": np.ones((8, 8), np.float32)}
  with pytest.raises(ValueError, match="needs a NamedSharding per leaf"):
    opt.update(g, opt.init(g))
