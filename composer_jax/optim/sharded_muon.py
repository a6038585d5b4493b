"""Sharded Muon: Newton–Schulz on whole matrices via one all-to-all per shape group.

Same math as `composer_jax.optim.muon.scale_by_muon` (momentum, Nesterov, update
scale — reused from there), for parameters sharded on a mesh (FSDP, tensor,
expert parallel). Orthogonalizing each shard separately would change the math,
and leaving per-leaf NS to GSPMD turns every iteration into all-reduces with the
matmuls replicated. Instead (the distributed Muon of the Composer 2.5 report and
of Dion, arXiv:2504.05295, §4):

1. Leaves of one mesh view are grouped by (fan_in, fan_out, mesh axes sharding the
   fan-in dim, mesh axes sharding the fan-out dim) — across parameters, layers,
   experts and heads. Inside `shard_map`, each device flattens its local blocks of
   a group to `[B, m/a, n/c]` (a, c = shard counts of the two matrix dims) and
   pads B to a multiple of k = a*c.
2. ONE `all_to_all` over the k matrix-sharding devices turns "matrix dims sharded,
   all B local" into "B/k whole matrices per device": `[k, B/k, m/a, n/c]` ->
   (received blocks from source (i, j)) -> `[B/k, m, n]`.
3. Batched Newton–Schulz on `[B/k, m, n]`, all local: no collective inside the
   iterations.
4. ONE `all_to_all` back, unpad, unflatten. Groups whose matrix dims are not
   sharded (e.g. experts over `expert`, matrices whole) skip 2 and 4.

All groups' forward all-to-alls are issued before any NS chain and the backward
ones after, so a scheduler with async collectives (GPU, TPU) can overlap group
k's transfers with group k+1's matmuls. Mesh axes that shard neither the batch
nor the matrix dims (e.g. HSDP `replica`) hold copies: those devices compute the
same NS redundantly, as every HSDP replica runs the optimizer.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from composer_jax.model import axes as axes_lib
from composer_jax.optim import muon, newton_schulz


class Leaf(NamedTuple):
  index: int  # position in the flat list of Muon leaves
  names: tuple[str, ...]
  spec: PartitionSpec
  shape: tuple[int, ...]  # global
  dtype: Any  # Newton–Schulz compute dtype


class Group(NamedTuple):
  """Leaves whose local blocks concatenate: same matrix shape and matrix sharding."""

  leaves: tuple[Leaf, ...]
  row_axes: tuple[str, ...]  # mesh axes sharding fan_in (in spec order)
  col_axes: tuple[str, ...]  # mesh axes sharding fan_out


def _dim_axes(spec: PartitionSpec, dim: int, mesh) -> tuple[str, ...]:
  """Mesh axes (of size > 1) that shard dim `dim` under `spec`."""
  entry = spec[dim] if dim < len(spec) else None
  axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
  return tuple(a for a in axes if mesh.shape[a] > 1)


def plan_groups(leaves: list[Leaf], mesh) -> list[Group]:
  """Groups Muon leaves of one mesh by (dtype, fan_in, fan_out, row axes, column axes)."""
  groups: dict[Any, list[Leaf]] = defaultdict(list)
  for leaf in leaves:
    _, (r, o) = axes_lib.muon_dims(leaf.names)
    key = (
      leaf.dtype,
      leaf.shape[r],
      leaf.shape[o],
      _dim_axes(leaf.spec, r, mesh),
      _dim_axes(leaf.spec, o, mesh),
    )
    groups[key].append(leaf)
  return [Group(tuple(ls), k[3], k[4]) for k, ls in groups.items()]


def _size(mesh, axes: tuple[str, ...]) -> int:
  return math.prod(mesh.shape[a] for a in axes)


def _all_to_all(x, group: Group):
  """Block i of axis 0 goes to device i of the group's axes; axis 0 then indexes sources.

  Sent as [k, -1]: XLA:CPU rejects an all-to-all whose operand is a transpose with
  a non-default layout ("operands with different shapes"); the flat view avoids it.
  """
  flat = jax.lax.all_to_all(
    x.reshape(x.shape[0], -1), group.row_axes + group.col_axes, 0, 0, tiled=True
  )
  return flat.reshape(x.shape)


def _gather_matrices(x, a: int, c: int, group: Group):
  """all_to_all: [k*b, m/a, n/c] matrix-sharded -> [b, m, n] whole (k = a*c)."""
  k, (bk, ml, nl) = a * c, x.shape
  x = _all_to_all(x.reshape(k, bk // k, ml, nl), group)  # axis 0: source block (i, j)
  x = x.reshape(a, c, bk // k, ml, nl).transpose(2, 0, 3, 1, 4)
  return x.reshape(bk // k, a * ml, c * nl)


def _scatter_matrices(y, a: int, c: int, group: Group):
  """Inverse of `_gather_matrices`: [b, m, n] -> [k*b, m/a, n/c]."""
  b, m, n = y.shape
  y = y.reshape(b, a, m // a, c, n // c).transpose(1, 3, 0, 2, 4)
  y = _all_to_all(y.reshape(a * c, b, m // a, n // c), group)
  return y.reshape(a * c * b, m // a, n // c)


def orthogonalize_sharded(
  xs: list[jax.Array],
  leaves: list[Leaf],
  mesh,
  table,
  eps,
  precision: str = "float32",
  batch_elements: int = -1,
):
  """NS of every matrix of every leaf (global arrays sharded on `mesh` as `leaf.spec`);
  `batch_elements` bounds each device's NS chunks (`newton_schulz.orthogonalize`).

  Returns arrays in `newton_schulz.compute_dtype` with the same shapes and shardings.
  """
  groups = plan_groups(leaves, mesh)
  pos = {leaf.index: i for i, leaf in enumerate(leaves)}

  def body(*blocks):
    stacked, restores, sizes = [], {}, []
    for g in groups:
      mats = []
      for leaf in g.leaves:
        m, restore = muon.to_matrices(blocks[pos[leaf.index]].astype(leaf.dtype), leaf.names)
        restores[leaf.index] = (restore, m.shape)
        mats.append(m.reshape((-1,) + m.shape[-2:]))
      x = jnp.concatenate(mats) if len(mats) > 1 else mats[0]
      sizes.append([m.shape[0] for m in mats])
      a, c = _size(mesh, g.row_axes), _size(mesh, g.col_axes)
      if a * c > 1:
        pad = -x.shape[0] % (a * c)
        x = jnp.pad(x, ((0, pad), (0, 0), (0, 0)))
        x = _gather_matrices(x, a, c, g)
      stacked.append(x)
    # All forward all-to-alls above, all NS chains here, all backward ones below.
    stacked = [
      newton_schulz.orthogonalize(x, table, len(table), eps, precision, batch_elements)
      for x in stacked
    ]
    outs = [None] * len(blocks)
    for g, y, n in zip(groups, stacked, sizes):
      a, c = _size(mesh, g.row_axes), _size(mesh, g.col_axes)
      if a * c > 1:
        y = _scatter_matrices(y, a, c, g)[: sum(n)]
      start = 0
      for leaf, count in zip(g.leaves, n):
        restore, shape = restores[leaf.index]
        outs[pos[leaf.index]] = restore(y[start : start + count].reshape(shape))
        start += count
    return tuple(outs)

  specs = tuple(leaf.spec for leaf in leaves)
  return list(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=specs)(*xs))


def muon_leaves(tree: Any, logical_axes: Any, shardings: Any) -> dict[Any, list[Leaf]]:
  """{mesh: [Leaf]} for the array leaves of `tree` (MaskedNode leaves are skipped).

  `logical_axes` and `shardings` are trees like the params (full trees are fine for a
  tree masked by `optax.partition`). `Leaf.index` is the position among
  `jax.tree.flatten(tree)` leaves, MaskedNodes counted.
  """
  flat, treedef = jax.tree.flatten(tree, is_leaf=lambda x: isinstance(x, optax.MaskedNode))
  names = treedef.flatten_up_to(logical_axes)
  shards = treedef.flatten_up_to(shardings)
  by_mesh = defaultdict(list)
  for i, (x, n, s) in enumerate(zip(flat, names, shards)):
    if isinstance(x, optax.MaskedNode):
      continue
    if not isinstance(s, NamedSharding):
      raise ValueError(f"sharded Muon needs a NamedSharding per leaf, got {s!r} for {n}")
    by_mesh[s.mesh].append(
      Leaf(i, tuple(n), s.spec, tuple(x.shape), newton_schulz.compute_dtype(x.dtype))
    )
  return dict(by_mesh)


def sharded_scale_by_muon(
  logical_axes: Any,
  shardings: Any,
  *,
  momentum: float = 0.95,
  nesterov: bool = True,
  ns_coeffs: newton_schulz.Coeffs = "quintic",
  ns_steps: int = 5,
  scale_mode: str = "consistent_rms",
  eps: float = 1e-7,
  ns_precision: str = "float32",
  ns_batch_elements: int = -1,
) -> optax.GradientTransformation:
  """`muon.scale_by_muon` for sharded parameters, NS via grouped all-to-alls.

  Args:
    logical_axes: tree like the params, leaves = tuples of logical names; every
      leaf reaching this transform must be a Muon parameter (`axes.uses_muon`;
      use `optax.partition` for mixed trees, masked leaves pass through).
    shardings: tree like the params of NamedSharding (e.g.
      `composer_jax.parallel.rules.param_shardings`); updates must be laid out so.
    momentum, nesterov, ns_coeffs, ns_steps, scale_mode, eps, ns_precision,
      ns_batch_elements: as in `muon.scale_by_muon`.

  Returns:
    GradientTransformation with state `muon.MuonState`; updates keep `shardings`.
  """
  table = muon.checked_table(scale_mode, ns_coeffs, ns_steps)
  newton_schulz.check_precision(ns_precision)
  budget = newton_schulz.resolve_batch_elements(ns_batch_elements)

  def directions(m_hat):
    flat, treedef = jax.tree.flatten(m_hat, is_leaf=lambda x: isinstance(x, optax.MaskedNode))
    shards = treedef.flatten_up_to(shardings)
    out = list(flat)
    for mesh, leaves in muon_leaves(m_hat, logical_axes, shardings).items():
      ys = orthogonalize_sharded(
        [flat[leaf.index] for leaf in leaves], leaves, mesh, table, eps, ns_precision, budget
      )
      for leaf, y in zip(leaves, ys):
        y = muon.scaled_direction(y, leaf.shape, leaf.names, scale_mode, flat[leaf.index].dtype)
        out[leaf.index] = jax.lax.with_sharding_constraint(y, shards[leaf.index])
    return treedef.unflatten(out)

  return muon.muon_transform(directions, momentum, nesterov)
