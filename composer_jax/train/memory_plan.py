"""Per-device memory plan of a run's train state, computed without allocating anything.

Shapes come from `jax.eval_shape` of the model init and the optimizer init; shardings from
the run's mesh layout and logical-axis rules laid over an `AbstractMesh` of the stated pod
size (`train.dry_run_devices`), so a 1T-parameter plan for a 1024-chip pod runs on a laptop.
Per-device bytes of a leaf are those of its largest shard (`NamedSharding.shard_shape`).
"""

from __future__ import annotations

import jax
import numpy as np

from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig
from composer_jax.optim import build_optimizer
from composer_jax.train import config as train_config
from composer_jax.train import placement
from composer_jax.train.state import abstract_state

_GIB = 1024**3


def _total_bytes(tree) -> int:
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def memory_plan(config, model_cfg: ModelConfig, device_count: int) -> dict:
  """Bytes per device and in total of params, gradients, optimizer state and router bias.

  Args:
    config: run config (`optim`, `mesh`, `rules` sections are used).
    model_cfg: the model.
    device_count: pod size the layout's -1 sizes are resolved against.

  Returns:
    dict with `mesh` (axis sizes of both views), `param_count`, `active_param_count`,
    `per_device` and `total` (each {params, grads, opt_state, router, sum} in bytes).
  """
  axes = transformer.logical_axes(model_cfg)["params"]
  optimizer = build_optimizer(train_config.optim_config(config), axes)
  key = jax.ShapeDtypeStruct((2,), np.uint32)
  abstract = abstract_state(model_cfg, optimizer, key)
  dm = placement.abstract_mesh(config.mesh, device_count, model_cfg, config.train.seq_len)
  shard = placement.state_shardings(abstract, optimizer, axes, dm, config.rules)
  per_device = {
    "params": placement.per_device_bytes(abstract.params, shard.params),
    "opt_state": placement.per_device_bytes(abstract.opt_state, shard.opt_state),
    "router": placement.per_device_bytes(abstract.router, shard.router),
  }
  # Gradients are accumulated in the params' dtype and sharding.
  per_device["grads"] = per_device["params"]
  total = {
    "params": _total_bytes(abstract.params),
    "opt_state": _total_bytes(abstract.opt_state),
    "router": _total_bytes(abstract.router),
  }
  total["grads"] = total["params"]
  for d in (per_device, total):
    d["sum"] = sum(d.values())
  n_total, n_active = transformer.param_counts(model_cfg)
  return {
    "mesh": {"dense": dict(dm.dense.shape), "expert": dict(dm.expert.shape)},
    "param_count": n_total,
    "active_param_count": n_active,
    "per_device": per_device,
    "total": total,
  }


def format_plan(plan: dict, device_count: int) -> str:
  """Human-readable table of `memory_plan` output."""
  lines = [
    f"Memory plan on {device_count} devices",
    f"  dense mesh  {plan['mesh']['dense']}",
    f"  expert mesh {plan['mesh']['expert']}",
    f"  parameters  {plan['param_count'] / 1e9:.2f}B total, "
    f"{plan['active_param_count'] / 1e9:.2f}B active per token",
    f"  {'':<10}{'per device':>14}{'whole pod':>14}",
  ]
  for k in ("params", "grads", "opt_state", "router", "sum"):
    lines.append(
      f"  {k:<10}{plan['per_device'][k] / _GIB:>10.2f} GiB{plan['total'][k] / _GIB:>10.1f} GiB"
    )
  lines.append("  (train state only: activations and XLA temporaries come on top)")
  return "\n".join(lines)
