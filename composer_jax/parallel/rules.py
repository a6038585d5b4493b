"""Logical-axis rules: parameter / activation axis names -> mesh axes, per mesh view.

`logical_to_spec` is the one place a PartitionSpec is made: parameter and optimizer-state
shardings (`param_shardings`, `composer_jax.train.placement`), batches, activation
constraints (`composer_jax.parallel.context_mesh.constrain`) and the in/out specs of the
model's `shard_map` layers (context-parallel attention, expert-parallel MoE) all resolve
logical names through the rules of the run's layout.

Rules are config data (`ml_collections.ConfigDict` with `dense` and `expert`
lists of `(logical_name, mesh_axes)`, mesh_axes None | str | tuple of str), in
the style of MaxText's `logical_axis_rules`. For one tensor, dims are resolved
left to right; a mesh axis already used by an earlier dim of the same tensor is
skipped (a mesh axis can shard one dim only), as are mesh axes of size 1.

Parameters whose logical names include 'experts' are placed on the expert view
with the `expert` rules, everything else on the dense view with the `dense`
rules (see `composer_jax.parallel.mesh`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from composer_jax.parallel.mesh import DualMesh

# Parameter dims shard over fsdp *and* context: context-parallel ranks hold
# different tokens but the same weights, so they can split the weights too
# (ZeRO-3 over fsdp x context, as MaxText does).
_DENSE_RULES = (
  ("layers", None),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("embed", ("fsdp", "context")),
  ("mlp", "tensor"),
  ("q_lora", ("fsdp", "context")),
  ("kv_lora", ("fsdp", "context")),
  ("head_dim", None),
  ("vocab", "tensor"),
  ("router", None),
  ("norm", None),
  # Activations.
  ("batch", ("replica", "fsdp")),
  ("seq", "context"),
  ("act_embed", None),
  ("act_heads", "tensor"),  # attention heads (and weights' heads dims) inside attention
)
_EXPERT_RULES = (
  ("layers", None),
  ("experts", "expert"),
  ("embed", None),
  ("expert_mlp", None),
  # Activations: routed tokens are spread over every device of the view.
  ("batch", ("expert_replica", "expert")),
  ("act_embed", None),
)


def default_rules() -> ml_collections.ConfigDict:
  """The default `rules` config section (dense and expert views)."""
  return ml_collections.ConfigDict(
    dict(dense=[tuple(r) for r in _DENSE_RULES], expert=[tuple(r) for r in _EXPERT_RULES])
  )


def _is_names(x) -> bool:
  return isinstance(x, tuple) and all(isinstance(s, str) for s in x)


def view_of(names: Sequence[str]) -> str:
  """'expert' for routed-expert parameters (names include 'experts'), else 'dense'."""
  return "expert" if "experts" in names else "dense"


def logical_to_spec(
  names: Sequence[Any],
  rules: Sequence,
  mesh: Mesh,
  shape: Sequence[int] | None = None,
  where: Any = "",
) -> PartitionSpec:
  """PartitionSpec on `mesh` for a tensor with logical axes `names`.

  Args:
    names: one logical name per dim, e.g. ('layers', 'embed', 'mlp'); None = a dim that is
      never sharded (e.g. a per-head feature dim inside attention); a tuple of names = a
      dim that flattens those dims, major first (e.g. `('batch', 'seq')` for the `[B*L]`
      tokens of a `[B, L]` array), sharded over their mesh axes in that order.
    rules: sequence of (logical_name, None | mesh axis | tuple of mesh axes).
    mesh: the mesh view the tensor lives on.
    shape: optional dims; each must be divisible by the product of its mesh axes.
    where: label (parameter path) for error messages.

  Raises:
    ValueError: a name without a rule, a rule naming a mesh axis the view lacks, or
      a dim not divisible by its mesh axes' product.
  """
  table = {}
  for rule in rules:
    name, axes = tuple(rule)
    table.setdefault(name, axes)
  used, spec = set(), []
  for d, entry in enumerate(names):
    dim_axes = []
    for name in (entry,) if entry is None or isinstance(entry, str) else tuple(entry):
      if name is None:
        continue
      if name not in table:
        raise ValueError(
          f"No sharding rule for logical axis {name!r} of {where} "
          f"{tuple(names)}; rules cover {sorted(table)}"
        )
      axes = table[name]
      axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
      for a in axes:
        if a not in mesh.shape:
          raise ValueError(
            f"Rule {name!r} -> {axes} names mesh axis {a!r}, not in this "
            f"view's axes {tuple(mesh.shape)}"
          )
      axes = tuple(a for a in axes if a not in used and mesh.shape[a] > 1)
      used.update(axes)
      dim_axes += axes
    if shape is not None:
      size = math.prod(mesh.shape[a] for a in dim_axes)
      if shape[d] % size:
        raise ValueError(
          f"{where} dim {d} ({entry!r}) of size {shape[d]} is not divisible by "
          f"mesh axes {tuple(dim_axes)} of total size {size}"
        )
    spec.append(None if not dim_axes else dim_axes[0] if len(dim_axes) == 1 else tuple(dim_axes))
  return PartitionSpec(*spec)


def param_sharding(
  names: Sequence[str],
  dual_mesh: DualMesh,
  rules_cfg,
  shape: Sequence[int] | None = None,
  where: Any = "",
) -> NamedSharding:
  """NamedSharding of one parameter (or a state leaf that mirrors one) on its view.

  Routed-expert leaves (`view_of(names)`) go to `dual_mesh.expert` with the `expert`
  rules, the rest to `dual_mesh.dense` with the `dense` rules.
  """
  view = view_of(names)
  mesh = dual_mesh.view(view)
  return NamedSharding(mesh, logical_to_spec(names, rules_cfg[view], mesh, shape, where))


def param_shardings(logical_axes_tree, dual_mesh: DualMesh, rules_cfg, shapes=None):
  """Tree of NamedSharding like `logical_axes_tree`.

  Args:
    logical_axes_tree: tree whose leaves are tuples of logical names
      (`composer_jax.model.transformer.logical_axes(cfg)`).
    dual_mesh: `make_meshes(...)` output.
    rules_cfg: ConfigDict with `dense` and `expert` rule lists (`default_rules()`).
    shapes: optional tree of arrays / ShapeDtypeStructs with the same structure;
      if given, every dim is checked for divisibility by its mesh axes.

  Returns:
    Tree of NamedSharding: expert parameters on `dual_mesh.expert`, others on
    `dual_mesh.dense`.
  """

  def one(path, names, shape=None):
    return param_sharding(names, dual_mesh, rules_cfg, shape, where=jax.tree_util.keystr(path))

  if shapes is None:
    return jax.tree_util.tree_map_with_path(one, logical_axes_tree, is_leaf=_is_names)
  return jax.tree_util.tree_map_with_path(
    lambda p, n, x: one(p, n, x.shape), logical_axes_tree, shapes, is_leaf=_is_names
  )


def activation_sharding(
  names: Sequence[str], dual_mesh: DualMesh, rules_cfg, view: str = "dense"
) -> NamedSharding:
  """NamedSharding for an activation with logical axes `names` on one view.

  E.g. `activation_sharding(('batch', 'seq', 'act_embed'), dm, rules)` for the
  hidden state `[batch, seq, embed]` of the dense view.
  """
  mesh = dual_mesh.view(view)
  return NamedSharding(mesh, logical_to_spec(names, rules_cfg[view], mesh, where="activation"))
