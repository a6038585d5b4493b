"""Dual device mesh: one flat device order, two views (dense and expert).

Non-expert weights (attention, dense MLP, embeddings, norms) are small, so their
FSDP group stays narrow (inside a node) and is replicated across nodes (HSDP).
Routed-expert weights hold most parameters and most Muon work, so they get a wide
expert-parallel view. Both views reshape the SAME flat device list, so

* one `jit` can take arrays sharded on either view (XLA requires every sharding of
  a computation to use the same flat device assignment, which both views share);
* independent parallel dimensions overlap on the same chips: context parallel 2 in
  the dense view and expert parallel 8 in the expert view run on 8 devices, where
  one shared mesh `context x expert` would need 16.

Dense view axes:  `replica x fsdp x context x tensor`  (slowest .. fastest varying).
Expert view axes: `expert_replica x expert`.

Config (`ml_collections.ConfigDict`, the `mesh` section of an experiment)::

  mesh.replica, mesh.fsdp, mesh.context, mesh.tensor   # dense view sizes
  mesh.expert_replica, mesh.expert                     # expert view sizes

At most one size per view may be -1: it absorbs the remaining devices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

DENSE_AXES = ("replica", "fsdp", "context", "tensor")
EXPERT_AXES = ("expert_replica", "expert")


class DualMesh(NamedTuple):
  """Two views of one flat device order: `dense` (DENSE_AXES), `expert` (EXPERT_AXES)."""

  dense: Mesh
  expert: Mesh

  def view(self, name: str) -> Mesh:
    """The mesh of view `name` ('dense' or 'expert')."""
    if name not in self._fields:
      raise ValueError(f"Unknown mesh view {name!r}; valid: {self._fields}")
    return getattr(self, name)


def default_mesh_config(**sizes) -> ml_collections.ConfigDict:
  """A `mesh` config section: pure FSDP over all devices unless overridden."""
  cfg = ml_collections.ConfigDict(
    dict(replica=1, fsdp=-1, context=1, tensor=1, expert_replica=1, expert=-1)
  )
  cfg.update(sizes)
  return cfg


def resolve_sizes(mesh_cfg, axes: Sequence[str], num_devices: int) -> tuple[int, ...]:
  """Axis sizes of one view, with a -1 entry filled so the product is `num_devices`.

  Raises:
    ValueError: a size is missing or < 1 (other than one -1), or the sizes do not
      multiply to `num_devices`.
  """
  sizes = []
  for a in axes:
    if a not in mesh_cfg:
      raise ValueError(f"mesh config lacks axis {a!r}; needs all of {tuple(axes)}")
    sizes.append(int(mesh_cfg[a]))
  free = [i for i, s in enumerate(sizes) if s == -1]
  if len(free) > 1 or any(s < 1 for i, s in enumerate(sizes) if i not in free):
    raise ValueError(f"mesh sizes {dict(zip(axes, sizes))} must be >= 1 (at most one -1)")
  fixed = math.prod(s for s in sizes if s != -1)
  if free:
    if num_devices % fixed:
      raise ValueError(
        f"mesh sizes {dict(zip(axes, sizes))}: fixed product {fixed} does not "
        f"divide the device count {num_devices}"
      )
    sizes[free[0]] = num_devices // fixed
  if math.prod(sizes) != num_devices:
    raise ValueError(
      f"mesh sizes {dict(zip(axes, sizes))} multiply to {math.prod(sizes)}, "
      f"not the device count {num_devices}"
    )
  return tuple(sizes)


def make_meshes(mesh_cfg, devices: Sequence[jax.Device] | None = None) -> DualMesh:
  """Builds the dense and expert views from one flat device order.

  Args:
    mesh_cfg: ConfigDict with the sizes of DENSE_AXES and EXPERT_AXES.
    devices: the flat device order (default `jax.devices()`: process-major, so
      consecutive devices share a host and the fastest-varying axes — `tensor`,
      `context`, then `fsdp` — stay inside a node).

  Returns:
    DualMesh whose two meshes have identical `devices.flat`.
  """
  devices = list(jax.devices() if devices is None else devices)
  flat = np.asarray(devices, dtype=object)
  dense = Mesh(flat.reshape(resolve_sizes(mesh_cfg, DENSE_AXES, len(devices))), DENSE_AXES)
  expert = Mesh(flat.reshape(resolve_sizes(mesh_cfg, EXPERT_AXES, len(devices))), EXPERT_AXES)
  return DualMesh(dense=dense, expert=expert)
