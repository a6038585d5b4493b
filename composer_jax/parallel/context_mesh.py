"""The dual mesh the model is traced with: one trace-time context for every parallel layer.

Layers that run `jax.shard_map` inside the model (context-parallel attention,
`composer_jax.parallel.context`; expert-parallel MoE, `composer_jax.parallel.expert_parallel`)
need the device mesh, which is a property of the run, not of `ModelConfig` (a checkpointed,
device-free description). The trainer makes it available while tracing::

    step = jax.jit(context_mesh.with_mesh(dual_mesh, train_step))

and a layer reads `context_mesh.current()` (None outside any `use_mesh`: single-device
semantics). It is read when the model is traced, so a cached trace keeps the mesh it saw;
wrap the function before jitting (`with_mesh`) so every retrace sees it too.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

from composer_jax.parallel.mesh import DualMesh

_stack: list[DualMesh] = []


@contextlib.contextmanager
def use_mesh(dual_mesh: DualMesh) -> Iterator[DualMesh]:
  """Makes `dual_mesh` the one `current()` returns while the block runs (nests)."""
  if not isinstance(dual_mesh, DualMesh):
    raise TypeError(f"use_mesh needs a DualMesh (parallel.mesh.make_meshes), got "
                    f"{type(dual_mesh).__name__}")
  _stack.append(dual_mesh)
  try:
    yield dual_mesh
  finally:
    _stack.pop()


def with_mesh(dual_mesh: DualMesh, fn: Callable) -> Callable:
  """`fn` run inside `use_mesh(dual_mesh)`: jit this, and every trace of it sees the mesh."""

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with use_mesh(dual_mesh):
      return fn(*args, **kwargs)

  return wrapped


def current() -> DualMesh | None:
  """The innermost `use_mesh` dual mesh, or None outside any."""
  return _stack[-1] if _stack else None
