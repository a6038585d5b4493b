"""Where RL data and weights live: trainer batches on the training layout, the sampler's mesh.

Trainer. RL batches (`trajectory.pack_batch`, `teacher.build_teacher_batch`) are placed like
supervised batches (`train.placement`): rows over the data axes, and per-token `[rows, L]`
arrays with the sequence over `context` in the zig-zag order the context-parallel model
expects. The loss gathers hidden states at slot positions (`slot_student_pos`,
`slot_teacher_pos`), so those are mapped to the zig-zag slots that hold them.

Sampler. The sampler has its own layout: weights replicated over its devices and the prompt
batch split over them (decoding is data-parallel; the training layout shards weights, which
would put a gather into every decoding step). Its devices are the trainer's (colocated) or a
disjoint set (disaggregated). `SamplerMesh.put_weights` moves weights from the training layout
to the sampling layout by resharding (`jax.device_put`) and reports the bytes that changed
device and the time it took.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from composer_jax.parallel import context
from composer_jax.parallel.mesh import DualMesh


def place_batch(batch: dict[str, np.ndarray], per_token: NamedSharding,
                student_length: int | None = None) -> dict[str, jax.Array]:
  """Host batch -> global arrays. `per_token`: the `[rows, L]` sharding (rows over data
  axes, L over `context`); other arrays are split over rows only.

  Every process passes the whole batch (the same on every process) and keeps its own rows.
  Per-token arrays are those shaped like `batch['tokens']`. With context parallelism
  (`context` > 1) they are put in zig-zag order, and slot positions are remapped to match:
  `slot_teacher_pos` into this batch's rows, `slot_student_pos` into the student rows of
  length `student_length` (teacher batches).
  """
  cp = per_token.mesh.shape.get("context", 1)
  rows_only = NamedSharding(per_token.mesh, PartitionSpec(per_token.spec[0]))
  slot_lengths = {"slot_teacher_pos": np.shape(batch["tokens"])[1],
                  "slot_student_pos": student_length}
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    if v.shape == np.shape(batch["tokens"]):
      if cp > 1:
        v = context.zigzag(v, cp, axis=1)
      out[k] = jax.make_array_from_process_local_data(per_token, v, v.shape)
      continue
    if cp > 1 and slot_lengths.get(k) is not None:
      # Original position p sits at zig-zag slot argsort(order)[p].
      v = np.argsort(context.zigzag_order(slot_lengths[k], cp))[v].astype(v.dtype)
    out[k] = jax.make_array_from_process_local_data(rows_only, v, v.shape)
  return out


def select_rows(batch: dict[str, jax.Array], rows: jax.Array, per_token: NamedSharding
                ) -> dict[str, jax.Array]:
  """Rows `rows [R]` of a batch placed by `place_batch` (jittable: a minibatch), laid out as
  `place_batch` lays out a batch when R splits over the row shards (else as XLA propagates).
  Rows are gathered whole, so a context-parallel zig-zag order of the columns is kept."""
  row_axes = per_token.spec[0]
  row_axes = () if row_axes is None else (row_axes,) if isinstance(row_axes, str) else row_axes
  shards = math.prod(per_token.mesh.shape[a] for a in row_axes)
  rows_only = NamedSharding(per_token.mesh, PartitionSpec(per_token.spec[0]))
  out = {}
  for k, v in batch.items():
    picked = v[rows]
    if rows.shape[0] % shards == 0:
      picked = jax.lax.with_sharding_constraint(
          picked, per_token if v.shape == batch["tokens"].shape else rows_only)
    out[k] = picked
  return out


def moved_bytes(x: jax.Array | np.ndarray, dst: NamedSharding) -> int:
  """Bytes of `x` that resharding to `dst` copies between devices: every destination shard
  that its device does not already hold with the same index (all of them for a host array)."""
  src = x.sharding.devices_indices_map(x.shape) if isinstance(x, jax.Array) else {}
  total = 0
  for d, idx in dst.devices_indices_map(x.shape).items():
    if src.get(d) != idx:
      shape = [len(range(*s.indices(n))) for s, n in zip(idx, x.shape)]
      total += math.prod(shape) * x.dtype.itemsize
  return total


class SamplerMesh:
  """A one-axis mesh ('data') over the sampler's devices: weights replicated, prompts split."""

  def __init__(self, devices: Sequence[jax.Device]):
    self.mesh = Mesh(np.asarray(list(devices), dtype=object), ("data",))
    self.replicated = NamedSharding(self.mesh, PartitionSpec())
    self._rows = NamedSharding(self.mesh, PartitionSpec("data"))

  @property
  def device_ids(self) -> list[int]:
    return [d.id for d in self.mesh.devices.flat]

  def put_weights(self, variables: Any) -> tuple[Any, dict[str, float]]:
    """`variables` on the sampling layout, and {'sampler/reshard_bytes', '.../seconds'}."""
    t0 = time.perf_counter()
    moved = sum(moved_bytes(x, self.replicated) for x in jax.tree.leaves(variables))
    out = jax.block_until_ready(jax.device_put(variables, self.replicated))
    return out, {"sampler/reshard_bytes": float(moved),
                 "sampler/reshard_seconds": time.perf_counter() - t0}

  def put_rows(self, x: np.ndarray) -> jax.Array:
    """A host `[B, ...]` array with its rows split over the devices (replicated when B does
    not divide)."""
    n = self.mesh.devices.size
    return jax.device_put(np.asarray(x), self._rows if len(x) % n == 0 else self.replicated)


def trainer_mesh_devices(dm: DualMesh) -> list[int]:
  """Device ids of the trainer's mesh."""
  return [d.id for d in dm.dense.devices.flat]
