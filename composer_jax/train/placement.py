"""Where the train state and batches live: dual mesh + logical-axis rules -> shardings.

The run config's `mesh` section gives the axis sizes of both mesh views (see
`composer_jax.parallel.mesh`; all 1 = one device) and `rules` the logical-axis rules
(`composer_jax.parallel.rules`). Parameters are sharded by their logical axes; optimizer
state leaves that the optimizer's init builds from a parameter (Adam moments, Muon momentum;
found by `jax.eval_shape` of the init over boxed params) get that parameter's sharding,
everything else (step counters, the router bias, the PRNG key) is replicated.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from composer_jax.model.config import ModelConfig
from composer_jax.parallel import context
from composer_jax.parallel import rules as rules_lib
from composer_jax.parallel.mesh import DENSE_AXES, EXPERT_AXES, DualMesh, make_meshes, resolve_sizes
from composer_jax.parallel.validation import validate_layout
from composer_jax.train.state import TrainState


def num_devices(mesh_cfg) -> int | None:
  """Devices the layout uses: the product of the dense sizes, or None if one is -1 (all)."""
  sizes = [int(mesh_cfg[a]) for a in DENSE_AXES]
  return None if -1 in sizes else math.prod(sizes)


def check_layout(
  mesh_cfg, model_cfg: ModelConfig, device_count: int, seq_len: int | None = None
) -> None:
  """`parallel.validation.validate_layout` with the sizes of `model_cfg` (one-line errors)."""
  c = model_cfg
  validate_layout(
    mesh_cfg,
    device_count,
    routed_experts=c.n_routed_experts if c.num_moe_layers else 0,
    heads=c.num_heads,
    kv_heads=c.num_kv_heads if c.attention == "gqa" else None,
    seq_len=seq_len,
  )


def build_mesh(mesh_cfg, model_cfg: ModelConfig, seq_len: int | None = None) -> DualMesh:
  """The dual mesh over the first `num_devices(mesh_cfg)` devices (all when a size is -1),
  after `check_layout` (the layout fits `model_cfg` and rows of `seq_len` tokens)."""
  n = num_devices(mesh_cfg)
  devices = jax.devices() if n is None else jax.devices()[:n]
  if n is not None and len(devices) < n:
    raise ValueError(f"mesh sizes {dict(mesh_cfg)} need {n} devices; {len(devices)} available")
  if jax.process_count() > 1 and len(devices) != jax.device_count():
    # Every process feeds its share of each batch to its own devices, so all must be in the mesh.
    raise ValueError(
      f"mesh sizes {dict(mesh_cfg)} use {len(devices)} of the "
      f"{jax.device_count()} devices of this {jax.process_count()}-process run; "
      "a multi-process mesh must span every device (a size of -1 takes the rest, "
      "as in the named layouts, e.g. --config=experiments/configs/default.py:fsdp)"
    )
  check_layout(mesh_cfg, model_cfg, len(devices), seq_len)
  return make_meshes(mesh_cfg, devices)


def abstract_mesh(
  mesh_cfg, device_count: int, model_cfg: ModelConfig, seq_len: int | None = None
) -> DualMesh:
  """Device-free `DualMesh` of `device_count` devices, for memory plans of a whole pod
  (after `check_layout`)."""
  check_layout(mesh_cfg, model_cfg, device_count, seq_len)
  dense = resolve_sizes(mesh_cfg, DENSE_AXES, device_count)
  expert = resolve_sizes(mesh_cfg, EXPERT_AXES, device_count)
  return DualMesh(dense=AbstractMesh(dense, DENSE_AXES), expert=AbstractMesh(expert, EXPERT_AXES))


def _is_names(x) -> bool:
  return isinstance(x, tuple) and all(isinstance(n, str) for n in x)


def opt_state_shardings(
  optimizer: optax.GradientTransformation, params: Any, logical_axes: Any, dm: DualMesh, rules_cfg
) -> Any:
  """NamedSharding tree like `optimizer.init(params)`, from the optimizer's own init.

  `jax.eval_shape(optimizer.init, ...)` runs over the params boxed with their logical axes
  (flax `nn.Partitioned`, as the model creates them): a state leaf the optimizer builds from
  a parameter (`zeros_like`: Adam moments, Muon momentum) comes out boxed with that
  parameter's names and is placed by the rules like it; the rest (step counters) is
  replicated.

  Args:
    optimizer: the optax transformation.
    params: tree of arrays / ShapeDtypeStructs (the trainable params).
    logical_axes: their logical-axis tree (`transformer.logical_axes(cfg)['params']`).
    dm: dual mesh (concrete or `abstract_mesh`).
    rules_cfg: ConfigDict with `dense` and `expert` rule lists.
  """
  boxed = jax.tree.map(
    lambda names, x: nn.Partitioned(x, names), logical_axes, params, is_leaf=_is_names
  )
  is_box = lambda x: isinstance(x, nn.Partitioned)
  replicated = NamedSharding(dm.dense, PartitionSpec())

  def one(path, x):
    if not is_box(x):
      return replicated
    return rules_lib.param_sharding(
      tuple(x.names), dm, rules_cfg, x.value.shape, where=jax.tree_util.keystr(path)
    )

  return jax.tree_util.tree_map_with_path(
    one, jax.eval_shape(optimizer.init, boxed), is_leaf=is_box
  )


def state_shardings(
  abstract: TrainState,
  optimizer: optax.GradientTransformation,
  logical_axes: Any,
  dm: DualMesh,
  rules_cfg,
) -> TrainState:
  """NamedSharding tree like `abstract` (a TrainState of ShapeDtypeStructs).

  Args:
    abstract: `state.abstract_state(model_cfg, optimizer, ...)`.
    optimizer: the optax transformation `abstract.opt_state` belongs to.
    logical_axes: logical-axis tree of the params (`transformer.logical_axes(cfg)['params']`).
    dm: dual mesh (concrete or `abstract_mesh`).
    rules_cfg: ConfigDict with `dense` and `expert` rule lists.
  """
  params = rules_lib.param_shardings(logical_axes, dm, rules_cfg, shapes=abstract.params)
  opt = opt_state_shardings(optimizer, abstract.params, logical_axes, dm, rules_cfg)
  replicated = NamedSharding(dm.dense, PartitionSpec())
  rep = lambda t: jax.tree.map(lambda _: replicated, t)
  return TrainState(
    step=replicated, params=params, router=rep(abstract.router), opt_state=opt, rng=replicated
  )


def batch_shardings(dm: DualMesh, rules_cfg) -> tuple[NamedSharding, NamedSharding]:
  """(train `[G, B, L]`, eval `[B, L]`) shardings: batch over data axes, seq over context."""
  spec = lambda names: NamedSharding(
    dm.dense, rules_lib.logical_to_spec(names, rules_cfg.dense, dm.dense, where="batch")
  )
  return spec((None, "batch", "seq")), spec(("batch", "seq"))


def to_global(batch: dict, sharding: NamedSharding, whole: bool = False) -> dict:
  """Process-local numpy batch `{name: [.., L]}` -> global jax arrays with `sharding`
  (`whole`: every process passes the whole global batch, the same in each, and keeps its
  share).

  With context parallelism (`context` > 1 in the sharding's mesh) the sequence axis is
  first put in the load-balanced zig-zag order the model then expects
  (`parallel.context.zigzag`; each process holds whole sequences: `context` is inside a host).
  """
  cp = sharding.mesh.shape.get("context", 1)
  order = (lambda x: context.zigzag(x, cp)) if cp > 1 else (lambda x: x)
  return {
    k: jax.make_array_from_process_local_data(
      sharding, order(np.asarray(v)), np.shape(v) if whole else None
    )
    for k, v in batch.items()
  }


def per_device_bytes(abstract: Any, shardings: Any) -> int:
  """Bytes one device holds of `abstract` under `shardings` (largest shard per leaf)."""
  leaves = jax.tree.leaves(abstract)
  shard = jax.tree.leaves(shardings, is_leaf=lambda s: isinstance(s, NamedSharding))
  return sum(
    math.prod(s.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize for x, s in zip(leaves, shard)
  )
