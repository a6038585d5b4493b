"""State shardings and the memory plan, against the parallel rules and hand counts."""

import math

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from composer_jax.model import transformer
from composer_jax.model.config import model_config
from composer_jax.optim import build_optimizer
from composer_jax.parallel import rules as rules_lib
from composer_jax.train import config as train_config
from composer_jax.train import memory_plan, placement
from composer_jax.train.state import abstract_state, init_state
from experiments.configs import base, default


def _setup(layout, optim="muon"):
  config = default.get_config()
  base.set_layout(config, layout)
  config.optim.name = optim
  model_cfg = model_config(config.model)
  axes = transformer.logical_axes(model_cfg)["params"]
  optimizer = build_optimizer(train_config.optim_config(config), axes)
  abstract = abstract_state(model_cfg, optimizer, jax.ShapeDtypeStruct((2,), np.uint32))
  return config, model_cfg, axes, abstract, optimizer


@pytest.mark.parametrize("optim", ["muon", "adamw"])
def test_optimizer_state_follows_param_shardings(optim):
  config, model_cfg, axes, abstract, optimizer = _setup("fsdp_ep", optim)
  dm = placement.build_mesh(config.mesh, model_cfg)
  shard = placement.state_shardings(abstract, optimizer, axes, dm, config.rules)
  expected = rules_lib.param_shardings(axes, dm, config.rules, shapes=abstract.params)
  assert shard.params == expected
  gate = shard.params["moe_layers"]["moe"]["experts"]["gate"]
  assert gate.spec == PartitionSpec(None, "expert", None, None) and gate.mesh == dm.expert
  # Reference by optax's own field names: every moment tree (`mu`, `nu`: Adam moments, Muon
  # momentum; MaskedNode where `optax.partition` gives a parameter to the other group) is
  # sharded leaf by leaf like the params; every other leaf is a replicated scalar counter.
  moments = [
    m
    for name in ("mu", "nu")
    for _, m in optax.tree_utils.tree_get_all_with_path(shard.opt_state, name)
  ]
  matched = []
  for m in moments:
    jax.tree.map(
      lambda e, s: matched.append(s == e) if isinstance(s, NamedSharding) else None, expected, m
    )
  assert matched and all(matched)
  others = [
    (x, s)
    for x, s in zip(jax.tree.leaves(abstract.opt_state), jax.tree.leaves(shard.opt_state))
    if x.shape == ()
  ]
  assert all(s.spec == PartitionSpec() for _, s in others)
  assert len(matched) + len(others) == len(jax.tree.leaves(shard.opt_state))
  assert shard.step.spec == PartitionSpec() and shard.rng.spec == PartitionSpec()


@pytest.mark.parametrize("layout,devices", [("single", 1), ("fsdp_ep", 8)])
def test_memory_plan_matches_hand_count(layout, devices):
  config, model_cfg, axes, abstract, _ = _setup(layout)
  plan = memory_plan.memory_plan(config, model_cfg, devices)
  dm = placement.abstract_mesh(config.mesh, devices, model_cfg)
  specs = rules_lib.param_shardings(axes, dm, config.rules, shapes=abstract.params)
  # Hand count: each parameter's size divided by the mesh axes its dims are split over.
  per_device = 0
  for x, s in zip(jax.tree.leaves(abstract.params), jax.tree.leaves(specs)):
    split = 1
    for entry in s.spec:
      for a in () if entry is None else (entry,) if isinstance(entry, str) else entry:
        split *= dict(s.mesh.shape)[a]
    per_device += math.prod(x.shape) * 4 // split
  assert plan["per_device"]["params"] == per_device
  total = sum(math.prod(x.shape) * 4 for x in jax.tree.leaves(abstract.params))
  assert plan["total"]["params"] == total
  if layout == "single":
    assert per_device == total
  else:
    assert per_device < total / 4
  assert plan["param_count"] == transformer.param_counts(model_cfg)[0]


@pytest.mark.parametrize("optim", ["muon", "adamw"])
def test_abstract_state_is_the_shape_of_init_state(optim):
  # Reference: `init_state` itself under `jax.eval_shape` (abstract_state reuses the model's
  # cached shapes instead of tracing the model again).
  _, model_cfg, _, abstract, optimizer = _setup("single", optim)
  key = jax.ShapeDtypeStruct((2,), np.uint32)
  want = jax.eval_shape(lambda k: init_state(model_cfg, optimizer, k), key)
  assert jax.tree.structure(abstract) == jax.tree.structure(want)
  assert jax.tree.leaves(abstract) == jax.tree.leaves(want)
