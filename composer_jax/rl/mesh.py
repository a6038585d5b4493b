"""Where RL data and weights live: trainer batches on the training layout, the sampler's mesh.

Every sharding here comes from logical axes through the layout's rules
(`parallel.rules.logical_to_spec`): `config.rules.dense` for the trainer's batches,
`config.rules.sampler` for the sampler.

Trainer (`batch_layout`). RL batches (`trajectory.pack_batch`, `teacher.build_teacher_batch`)
are placed like supervised batches (`train.placement`): rows ('batch') over the data axes, and
per-token `[rows, L]` arrays ('batch', 'seq') with the sequence over `context` in the zig-zag
order the context-parallel model expects. The loss gathers hidden states at slot positions
(`slot_student_pos`, `slot_teacher_pos`), so those are mapped to the zig-zag slots that hold
them.

Sampler (`SamplerMesh`). The sampler has its own layout, a one-axis mesh ('data') with rules
`sampler_rules()` by default: every weight dim replicated over its devices and the prompt
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
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding

from composer_jax.model import axes
from composer_jax.parallel import context
from composer_jax.parallel import rules as rules_lib
from composer_jax.parallel.mesh import DualMesh

SAMPLER_AXES = ("data",)


class BatchLayout(NamedTuple):
  """Where an RL batch lives on the trainer's mesh (`batch_layout`): `tokens` for per-token
  `[rows, L]` arrays, `rows` for per-row `[rows, ...]` ones."""

  tokens: NamedSharding
  rows: NamedSharding


def batch_layout(dm: DualMesh, rules_cfg) -> BatchLayout:
  """The trainer's `BatchLayout` on the dense view: logical ('batch', 'seq') and ('batch',)
  through the layout's `dense` rules."""
  spec = lambda names: NamedSharding(
    dm.dense, rules_lib.logical_to_spec(names, rules_cfg.dense, dm.dense, where="RL batch")
  )
  return BatchLayout(spec(("batch", "seq")), spec(("batch",)))


def sampler_rules() -> list[tuple]:
  """Default `config.rules.sampler` (`SAMPLER_AXES` mesh): every weight dim replicated, the
  batch over 'data'."""
  return [(name, None) for name in axes.ALL_AXES] + [("batch", "data")]


def row_blocks(rows: NamedSharding) -> int:
  """How many blocks a rows-sharded `[rows, ...]` array is split into."""
  n = rows.mesh.size
  return n // rows.shard_shape((n,))[0]


def place_batch(
  batch: dict[str, np.ndarray], layout: BatchLayout, student_length: int | None = None
) -> dict[str, jax.Array]:
  """Host batch -> global arrays: arrays shaped like `batch['tokens']` per `layout.tokens`
  (rows over data axes, L over `context`), the others per `layout.rows`.

  Every process passes the whole batch (the same on every process) and keeps its own rows.
  Per-token arrays are those shaped like `batch['tokens']`. With context parallelism
  (`context` > 1) they are put in zig-zag order, and slot positions are remapped to match:
  `slot_teacher_pos` into this batch's rows, `slot_student_pos` into the student rows of
  length `student_length` (teacher batches).
  """
  cp = layout.tokens.mesh.shape.get("context", 1)
  slot_lengths = {
    "slot_teacher_pos": np.shape(batch["tokens"])[1],
    "slot_student_pos": student_length,
  }
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    if v.shape == np.shape(batch["tokens"]):
      if cp > 1:
        v = context.zigzag(v, cp, axis=1)
      out[k] = jax.make_array_from_process_local_data(layout.tokens, v, v.shape)
      continue
    if cp > 1 and slot_lengths.get(k) is not None:
      # Original position p sits at zig-zag slot argsort(order)[p].
      v = np.argsort(context.zigzag_order(slot_lengths[k], cp))[v].astype(v.dtype)
    out[k] = jax.make_array_from_process_local_data(layout.rows, v, v.shape)
  return out


def select_rows(
  batch: dict[str, jax.Array], rows: jax.Array, layout: BatchLayout
) -> dict[str, jax.Array]:
  """Rows `rows [R]` of a batch placed by `place_batch` (jittable: a minibatch), laid out as
  `place_batch` lays out a batch when R splits over the row shards (else as XLA propagates).
  Rows are gathered whole, so a context-parallel zig-zag order of the columns is kept."""
  shards = row_blocks(layout.rows)
  out = {}
  for k, v in batch.items():
    picked = v[rows]
    if rows.shape[0] % shards == 0:
      picked = jax.lax.with_sharding_constraint(
        picked, layout.tokens if v.shape == batch["tokens"].shape else layout.rows
      )
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
  """A one-axis mesh (`SAMPLER_AXES`) over the sampler's devices; shardings from the logical
  axes through `rules` (`config.rules.sampler`, e.g. `sampler_rules()`)."""

  def __init__(self, devices: Sequence[jax.Device], rules: Sequence):
    self.mesh = Mesh(np.asarray(list(devices), dtype=object), SAMPLER_AXES)
    self._rules = rules
    self.replicated = self.sharding(())
    self._rows = self.sharding(("batch",))

  def sharding(
    self, names: Sequence[str], shape: Sequence[int] | None = None, where: str = "sampler"
  ) -> NamedSharding:
    """The sampler's sharding of a tensor with logical axes `names`."""
    return NamedSharding(
      self.mesh, rules_lib.logical_to_spec(names, self._rules, self.mesh, shape, where)
    )

  @property
  def device_ids(self) -> list[int]:
    return [d.id for d in self.mesh.devices.flat]

  def put_weights(self, tree: Any, logical_axes: Any) -> tuple[Any, dict[str, float]]:
    """`tree` (params or router bias, leaves named by `logical_axes`, a like tree of
    logical-name tuples: `transformer.logical_axes(cfg)[...]`) on the sampling layout, and
    {'sampler/reshard_bytes', '.../seconds'}."""
    t0 = time.perf_counter()
    dst = jax.tree_util.tree_map_with_path(
      lambda path, names, x: self.sharding(names, x.shape, jax.tree_util.keystr(path)),
      logical_axes,
      tree,
      is_leaf=lambda x: isinstance(x, tuple),
    )
    moved = sum(moved_bytes(x, s) for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(dst)))
    out = jax.block_until_ready(jax.device_put(tree, dst))
    return out, {
      "sampler/reshard_bytes": float(moved),
      "sampler/reshard_seconds": time.perf_counter() - t0,
    }

  def put_rows(self, x: np.ndarray) -> jax.Array:
    """A host `[B, ...]` array (the same in every process) with its rows ('batch') split as
    the rules say (replicated when B does not divide)."""
    x = np.asarray(x)
    return jax.device_put(
      x, self._rows if len(x) % row_blocks(self._rows) == 0 else self.replicated
    )

  @staticmethod
  def to_host(x: jax.Array) -> np.ndarray:
    """The whole of `x` as a host array in every process (gathered across processes when it
    spans several)."""
    if x.is_fully_addressable:
      return np.asarray(x)
    return multihost_utils.process_allgather(x, tiled=True)


def trainer_mesh_devices(dm: DualMesh) -> list[int]:
  """Device ids of the trainer's mesh."""
  return [d.id for d in dm.dense.devices.flat]
