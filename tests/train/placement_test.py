"""State shardings and the memory plan, against the parallel rules and hand counts."""

import math

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from composer_jax.model import transformer
from composer_jax.optim import build_optimizer
from composer_jax.parallel import rules as rules_lib
from composer_jax.train import loop, memory_plan, placement
from composer_jax.train.state import abstract_state
from experiments.configs import base, default


def _setup(layout):
  config = default.get_config()
  base.set_layout(config, layout)
  model_cfg = loop.model_config(config)
  axes = transformer.logical_axes(model_cfg)["params"]
  abstract = abstract_state(model_cfg, build_optimizer(config.optim, axes),
                            jax.ShapeDtypeStruct((2,), np.uint32))
  return config, model_cfg, axes, abstract


def test_optimizer_state_follows_param_shardings():
  config, model_cfg, axes, abstract = _setup("fsdp_ep")
  dm = placement.build_mesh(config.mesh, model_cfg)
  shard = placement.state_shardings(abstract, axes, dm, config.rules)
  expected = rules_lib.param_shardings(axes, dm, config.rules, shapes=abstract.params)
  assert shard.params == expected
  gate = shard.params["moe_layers"]["moe"]["experts"]["gate"]
  assert gate.spec == PartitionSpec(None, "expert", None, None) and gate.mesh == dm.expert
  # Every optimizer-state leaf shaped like a parameter is sharded like it (Adam moments,
  # Muon momentum); the rest (counters) is replicated.
  by_shape = {}
  for x, s in zip(jax.tree.leaves(abstract.params), jax.tree.leaves(expected)):
    by_shape.setdefault(x.shape, set()).add(s)
  for x, s in zip(jax.tree.leaves(abstract.opt_state), jax.tree.leaves(shard.opt_state)):
    if x.shape in by_shape:
      assert s in by_shape[x.shape]
    else:
      assert s.spec == PartitionSpec()
  assert shard.step.spec == PartitionSpec() and shard.rng.spec == PartitionSpec()


@pytest.mark.parametrize("layout,devices", [("single", 1), ("fsdp_ep", 8)])
def test_memory_plan_matches_hand_count(layout, devices):
  config, model_cfg, axes, abstract = _setup(layout)
  plan = memory_plan.memory_plan(config, model_cfg, devices)
  dm = placement.abstract_mesh(config.mesh, devices, model_cfg)
  specs = rules_lib.param_shardings(axes, dm, config.rules, shapes=abstract.params)
  # Hand count: each parameter's size divided by the mesh axes its dims are split over.
  per_device = 0
  for x, s in zip(jax.tree.leaves(abstract.params), jax.tree.leaves(specs)):
    split = 1
    for entry in s.spec:
      for a in (() if entry is None else (entry,) if isinstance(entry, str) else entry):
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
