"""The layout the model is traced with: one trace-time context for every parallel layer.

Layers that run `jax.shard_map` inside the model (context-parallel attention,
`composer_jax.parallel.context`; expert-parallel MoE, `composer_jax.parallel.expert_parallel`)
and the model's activation sharding constraints need the device mesh and the logical-axis
rules, which are properties of the run, not of `ModelConfig` (a checkpointed, device-free
description). The trainer makes them available while tracing::

    step = jax.jit(context_mesh.with_mesh(dual_mesh, rules, train_step))

and a layer reads `context_mesh.current()` / `current_rules()` (None outside any `use_mesh`:
single-device semantics). They are read when the model is traced, so a cached trace keeps
the layout it saw; wrap the function before jitting (`with_mesh`) so every retrace sees it.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax

from composer_jax.parallel import rules as rules_lib
from composer_jax.parallel.mesh import DualMesh


class Layout(NamedTuple):
  """A dual mesh and the rules (`dense`, `expert` lists, `rules.default_rules()`) over it."""

  mesh: DualMesh
  rules: Any


_stack: list[Layout] = []


@contextlib.contextmanager
def use_mesh(dual_mesh: DualMesh, rules_cfg) -> Iterator[DualMesh]:
  """Makes `dual_mesh` and `rules_cfg` what `current()` / `current_rules()` return while the
  block runs (nests)."""
  if not isinstance(dual_mesh, DualMesh):
    raise TypeError(
      f"use_mesh needs a DualMesh (parallel.mesh.make_meshes), got {type(dual_mesh).__name__}"
    )
  missing = [v for v in DualMesh._fields if v not in rules_cfg]
  if missing:
    raise ValueError(
      f"use_mesh needs rules for both mesh views; rules lack {missing} "
      "(see parallel.rules.default_rules())"
    )
  _stack.append(Layout(dual_mesh, rules_cfg))
  try:
    yield dual_mesh
  finally:
    _stack.pop()


def with_mesh(dual_mesh: DualMesh, rules_cfg, fn: Callable) -> Callable:
  """`fn` run inside `use_mesh(dual_mesh, rules_cfg)`: jit this, and every trace sees them."""

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with use_mesh(dual_mesh, rules_cfg):
      return fn(*args, **kwargs)

  return wrapped


def current() -> DualMesh | None:
  """The innermost `use_mesh` dual mesh, or None outside any."""
  return _stack[-1].mesh if _stack else None


def current_rules():
  """The innermost `use_mesh` rules (`dense` and `expert` lists), or None outside any."""
  return _stack[-1].rules if _stack else None


def shards(name: str, view: str = "dense") -> int:
  """Into how many parts the current rules split logical activation axis `name` on `view`
  (1 outside any `use_mesh`)."""
  if not _stack:
    return 1
  layout = _stack[-1]
  sharding = rules_lib.activation_sharding((name,), layout.mesh, layout.rules, view)
  axes = sharding.spec[0] if sharding.spec else None
  axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
  return math.prod(sharding.mesh.shape[a] for a in axes)


def constrain(x: jax.Array, names: Sequence[str | None], view: str = "dense") -> jax.Array:
  """`x` constrained to the sharding the current rules give logical axes `names` on `view`.

  Pins activations where GSPMD's propagation would otherwise pick a sharding it cannot
  leave efficiently (e.g. the embedding gather, sharded like the table's `embed` dim, then
  needed by batch and sequence). Outside any `use_mesh`, `x` is returned unchanged.
  """
  if not _stack:
    return x
  layout = _stack[-1]
  return jax.lax.with_sharding_constraint(
    x, rules_lib.activation_sharding(names, layout.mesh, layout.rules, view)
  )
