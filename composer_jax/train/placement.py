"""Where the train state and batches live: dual mesh + logical-axis rules -> shardings.

The run config's `mesh` section gives the axis sizes of both mesh views (see
`composer_jax.parallel.mesh`; all 1 = one device) and `rules` the logical-axis rules
(`composer_jax.parallel.rules`). Parameters are sharded by their logical axes; optimizer
state leaves that mirror a parameter (Adam moments, Muon momentum) get that parameter's
sharding, everything else (step counters, the router bias, the PRNG key) is replicated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
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


def check_layout(mesh_cfg, model_cfg: ModelConfig, device_count: int,
                 seq_len: int | None = None) -> None:
  """`parallel.validation.validate_layout` with the sizes of `model_cfg` (one-line errors)."""
  c = model_cfg
  validate_layout(mesh_cfg, device_count,
                  routed_experts=c.n_routed_experts if c.num_moe_layers else 0,
                  heads=c.num_heads, kv_heads=c.num_kv_heads if c.attention == "gqa" else None,
                  seq_len=seq_len)


def build_mesh(mesh_cfg, model_cfg: ModelConfig, seq_len: int | None = None) -> DualMesh:
  """The dual mesh over the first `num_devices(mesh_cfg)` devices (all when a size is -1),
  after `check_layout` (the layout fits `model_cfg` and rows of `seq_len` tokens)."""
  n = num_devices(mesh_cfg)
  devices = jax.devices() if n is None else jax.devices()[:n]
  if n is not None and len(devices) < n:
    raise ValueError(f"mesh sizes {dict(mesh_cfg)} need {n} devices; {len(devices)} available")
  if jax.process_count() > 1 and len(devices) != jax.device_count():
    # Every process feeds its share of each batch to its own devices, so all must be in the mesh.
    raise ValueError(f"mesh sizes {dict(mesh_cfg)} use {len(devices)} of the "
                     f"{jax.device_count()} devices of this {jax.process_count()}-process run; "
                     "a multi-process mesh must span every device (a size of -1 takes the rest, "
                     "as in the named layouts, e.g. --config=experiments/configs/default.py:fsdp)")
  check_layout(mesh_cfg, model_cfg, len(devices), seq_len)
  return make_meshes(mesh_cfg, devices)


def abstract_mesh(mesh_cfg, device_count: int, model_cfg: ModelConfig,
                  seq_len: int | None = None) -> DualMesh:
  """Device-free `DualMesh` of `device_count` devices, for memory plans of a whole pod
  (after `check_layout`)."""
  check_layout(mesh_cfg, model_cfg, device_count, seq_len)
  dense = resolve_sizes(mesh_cfg, DENSE_AXES, device_count)
  expert = resolve_sizes(mesh_cfg, EXPERT_AXES, device_count)
  return DualMesh(dense=AbstractMesh(dense, DENSE_AXES), expert=AbstractMesh(expert, EXPERT_AXES))


def _dict_suffix(path: Sequence[Any]) -> tuple[str, ...]:
  """Trailing dict keys of a pytree path: the parameter path inside an optimizer state."""
  keys = []
  for k in reversed(path):
    if not isinstance(k, jax.tree_util.DictKey):
      break
    keys.append(k.key)
  return tuple(reversed(keys))


def state_shardings(abstract: TrainState, logical_axes: Any, dm: DualMesh, rules_cfg) -> TrainState:
  """NamedSharding tree like `abstract` (a TrainState of ShapeDtypeStructs).

  Args:
    abstract: `state.abstract_state(...)`.
    logical_axes: logical-axis tree of the params (`transformer.logical_axes(cfg)['params']`).
    dm: dual mesh (concrete or `abstract_mesh`).
    rules_cfg: ConfigDict with `dense` and `expert` rule lists.
  """
  params = rules_lib.param_shardings(logical_axes, dm, rules_cfg, shapes=abstract.params)
  replicated = NamedSharding(dm.dense, PartitionSpec())
  by_path = {}
  for path, s in jax.tree_util.tree_flatten_with_path(params)[0]:
    by_path[_dict_suffix(path)] = s

  flat_params = dict(
      (_dict_suffix(p), x) for p, x in jax.tree_util.tree_flatten_with_path(abstract.params)[0])

  def opt_leaf(path, x):
    key = _dict_suffix(path)
    # The longest dict-key suffix that names a parameter of the same shape.
    for i in range(len(key)):
      k = key[i:]
      if k in by_path and flat_params[k].shape == x.shape:
        return by_path[k]
    return replicated

  opt = jax.tree_util.tree_map_with_path(opt_leaf, abstract.opt_state)
  rep = lambda t: jax.tree.map(lambda _: replicated, t)
  return TrainState(step=replicated, params=params, router=rep(abstract.router), opt_state=opt,
                    rng=replicated)


def batch_shardings(dm: DualMesh, rules_cfg) -> tuple[NamedSharding, NamedSharding]:
  """(train `[G, B, L]`, eval `[B, L]`) shardings: batch over data axes, seq over context."""
  bl = rules_lib.logical_to_spec(("batch", "seq"), rules_cfg.dense, dm.dense, where="batch")
  return (NamedSharding(dm.dense, PartitionSpec(None, *bl)), NamedSharding(dm.dense, bl))


def to_global(batch: dict, sharding: NamedSharding) -> dict:
  """Process-local numpy batch `{name: [.., L]}` -> global jax arrays with `sharding`.

  With context parallelism (`context` > 1 in the sharding's mesh) the sequence axis is
  first put in the load-balanced zig-zag order the model then expects
  (`parallel.context.zigzag`; each process holds whole sequences: `context` is inside a host).
  """
  cp = sharding.mesh.shape.get("context", 1)
  order = (lambda x: context.zigzag(x, cp)) if cp > 1 else (lambda x: x)
  return {k: jax.make_array_from_process_local_data(sharding, order(np.asarray(v)))
          for k, v in batch.items()}


def per_device_bytes(abstract: Any, shardings: Any) -> int:
  """Bytes one device holds of `abstract` under `shardings` (largest shard per leaf)."""
  leaves = jax.tree.leaves(abstract)
  shard = jax.tree.leaves(shardings, is_leaf=lambda s: isinstance(s, NamedSharding))
  return sum(math.prod(s.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
             for x, s in zip(leaves, shard))
