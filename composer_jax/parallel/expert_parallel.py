"""Expert-parallel MoE dispatch: routed experts sharded over the `expert` mesh axis.

GShard-style (arXiv 2006.16668 §2.2) dispatch / combine in `jax.shard_map` over the expert
view of the dual mesh (`expert_replica x expert`, `composer_jax.parallel.mesh`):

1. every device holds `T / (R * EP)` tokens and `E / EP` experts (replicated over the R
   `expert_replica` groups; each group exchanges tokens only inside itself);
2. it sorts its `T_s * K` token-expert assignments by expert — hence by destination shard
   `e // (E / EP)` — and sends each shard the rows for its experts (all-to-all #1);
3. each shard runs the grouped matmul (`expert_fn`, `moe.grouped_swiglu`: `ragged_dot`) on
   what it received, sorted by its local expert;
4. results go back the same way (all-to-all #2) and are combined with the gate weights:
   `y_t = sum_k g_tk * expert_{e_tk}(x_t)`.

The exchange is `jax.lax.ragged_all_to_all` on GPU/TPU (only the rows that exist move;
every shard's receive buffer has `EP * C` rows) and, because XLA:CPU lacks that op, a dense
`jax.lax.all_to_all` of fixed `[EP, C, D]` per-peer buffers on CPU. By default `C` is the
worst case, `T_s * min(K, E / EP)` (every local assignment to one shard), so nothing can
drop and the result equals the single-device `dropless` dispatch — at the price of
buffers `EP * min(K, E/EP) / K` times the balanced load, fine for tests and small EP. At
scale set `capacity_factor=f` (`ModelConfig.ep_capacity_factor`): `C = ceil(f * T_s * K /
EP)`, `f` times the balanced load. What overflows is dropped — contributes 0 — and
counted (valid tokens only; `moe/dropped_tokens` in the train metrics): per peer buffer on
CPU (assignments past the first `C` for that shard, in expert then token order); per
receiving shard on GPU/TPU (past its `EP * C` rows, senders in shard order).

`ModelConfig.moe_dispatch = 'expert_parallel'` selects this dispatch; the mesh and rules come
from the trainer, not the model config: `moe.Experts` passes the expert view of
`context_mesh.current()` and the expert rules of `context_mesh.current_rules()`
(`jax.jit(context_mesh.with_mesh(dual_mesh, rules, fn))`) and, outside any mesh, runs the
single-device `dropless` dispatch instead. The `shard_map` specs come from those rules
(`specs`): tokens `('batch', 'act_embed')`, weights by their parameter names; the expert-parallel
axis is the one mesh axis the rules shard 'experts' over.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from composer_jax.parallel import rules as rules_lib


def buffer_capacity(
  tokens_per_shard: int, k: int, num_experts: int, ep: int, capacity_factor: float | None
) -> int:
  """Rows `C` of one per-peer buffer: the worst case `T_s * min(K, E/EP)` if
  `capacity_factor` is None, else `ceil(f * T_s * K / EP)` (at most the worst case)."""
  worst = tokens_per_shard * min(k, num_experts // ep)
  if capacity_factor is None:
    return worst
  return max(1, min(worst, math.ceil(capacity_factor * tokens_per_shard * k / ep)))


class Specs(NamedTuple):
  """The `shard_map` layout of the dispatch, from the expert-view rules.

  Attributes:
    tokens: spec of `x [T, D]` and `y`.
    rows: spec of the other per-token inputs (`[T]`, `[T, K]`: split like tokens, K whole).
    gate_up, down: specs of `gate`/`up [E, D, F]` and `down [E, F, D]`.
    ep_axis: the mesh axis experts are split over (None: every device holds all experts).
    token_axes: the mesh axes tokens are split over.
  """

  tokens: PartitionSpec
  rows: PartitionSpec
  gate_up: PartitionSpec
  down: PartitionSpec
  ep_axis: str | None
  token_axes: tuple[str, ...]


def _axes(entry) -> tuple[str, ...]:
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def specs(mesh: Mesh, rules: Sequence) -> Specs:
  """The dispatch's specs on the expert view `mesh` under the expert `rules`.

  Raises:
    ValueError: the rules shard experts over more than one mesh axis, or split a token's
      row or an expert's matrices (whole ones are what the grouped matmul multiplies).
  """
  spec = functools.partial(
    rules_lib.logical_to_spec, rules=rules, mesh=mesh, where="expert-parallel dispatch"
  )
  tokens = spec(("batch", "act_embed"))
  gate_up = spec(("experts", "embed", "expert_mlp"))
  down = spec(("experts", "expert_mlp", "embed"))
  ep_axes = _axes(gate_up[0])
  if (
    len(ep_axes) > 1
    or tokens[1:] != (None,)
    or gate_up[1:] != (None, None)
    or (down[1:] != (None, None))
  ):
    raise ValueError(
      f"expert-parallel dispatch needs expert rules that shard 'experts' over one "
      f"mesh axis and leave 'embed', 'expert_mlp', 'act_embed' whole; these give "
      f"tokens {tokens}, gate/up {gate_up}, down {down} (use moe_dispatch="
      f"'dropless' with this layout)"
    )
  return Specs(
    tokens, spec(("batch",)), gate_up, down, ep_axes[0] if ep_axes else None, _axes(tokens[0])
  )


def _dense_exchange(rows, ids, dest, rank, counts, *, axis, ep, cap, empty):
  """Fixed `[EP, C]` per-peer buffers and `all_to_all` over mesh axis `axis` (any backend;
  `axis` None: one expert shard, the exchange is the identity).

  Args: `rows [A, D]` and local expert `ids [A]` sorted by destination shard `dest [A]`,
  `rank [A]` position within its destination, `counts [EP]` rows per destination.
  Returns (received rows `[EP*C, D]`, ids `[EP*C]` (`empty` = unused slot), `keep [A]`,
  `back(out [EP*C, D]) -> [A, D]` results in the sent order, 0 where not kept).
  """
  del counts
  keep = rank < cap
  slot = jnp.where(keep, dest * cap + rank, ep * cap)  # overflow -> a dummy slot, cut below
  send = jnp.zeros((ep * cap + 1, rows.shape[-1]), rows.dtype).at[slot].set(rows)[:-1]
  send_ids = jnp.full((ep * cap + 1,), empty, jnp.int32).at[slot].set(ids)[:-1]
  a2a = (
    (lambda a: a)
    if axis is None
    else functools.partial(
      jax.lax.all_to_all, axis_name=axis, split_axis=0, concat_axis=0, tiled=True
    )
  )

  def back(out):
    out = jnp.concatenate([a2a(out), jnp.zeros_like(out[:1])])
    return out[slot]

  return a2a(send), a2a(send_ids), keep, back


def _ragged_exchange(rows, ids, dest, rank, counts, *, axis, ep, cap, empty):
  """`ragged_all_to_all` into an `[EP*C]`-row receive buffer (GPU/TPU); as `_dense_exchange`.

  Sender i's rows for shard j land at `offset[i, j] = sum_{i' < i} counts[i', j]` of j's
  buffer; what would pass its end is not sent (dropped).
  """
  size = ep * cap
  me = jax.lax.axis_index(axis)
  all_counts = jax.lax.all_gather(counts, axis)  # [EP senders, EP receivers]
  offset = jnp.cumsum(all_counts, axis=0) - all_counts
  sent = jnp.clip(size - offset, 0, all_counts)  # rows that fit, [sender, receiver]
  starts = jnp.cumsum(all_counts, axis=1) - all_counts  # [i, j]: j's rows in i's `rows`
  keep = rank < sent[me][dest]
  ragged = functools.partial(jax.lax.ragged_all_to_all, axis_name=axis)
  recv = ragged(
    rows,
    jnp.zeros((size, rows.shape[-1]), rows.dtype),
    starts[me],
    sent[me],
    offset[me],
    sent[:, me],
  )
  recv_ids = ragged(
    ids, jnp.full((size,), empty, jnp.int32), starts[me], sent[me], offset[me], sent[:, me]
  )

  def back(out):  # the reverse exchange: sender i's rows return to where i keeps them
    return ragged(out, jnp.zeros_like(rows), offset[:, me], sent[:, me], starts[:, me], sent[me])

  return recv, recv_ids, keep, back


def _shard_moe(x, weights, experts, valid, gate, up, down, *, expert_fn, ep_specs, ep, cap, ragged):
  """One device: `x [T_s, D]`, `weights/experts [T_s, K]`, `valid [T_s]`, local expert
  weights `[E/EP, ...]` -> (`[T_s, D]`, dropped valid assignments summed over devices)."""
  num_tokens, k = experts.shape
  local = gate.shape[0]
  flat = experts.reshape(-1)
  order = jnp.argsort(flat, stable=True)  # assignments sorted by expert, so by destination
  sorted_experts = flat[order]
  dest = sorted_experts // local
  counts = jnp.bincount(dest, length=ep).astype(jnp.int32)
  rank = jnp.arange(flat.size) - (jnp.cumsum(counts) - counts)[dest]
  exchange = _ragged_exchange if ragged else _dense_exchange
  recv, recv_ids, keep, back = exchange(
    x[order // k],
    (sorted_experts % local).astype(jnp.int32),
    dest,
    rank,
    counts,
    axis=ep_specs.ep_axis,
    ep=ep,
    cap=cap,
    empty=local,
  )
  by_expert = jnp.argsort(recv_ids, stable=True)  # unused slots (id `local`) last
  group_sizes = jnp.bincount(recv_ids, length=local + 1)[:local].astype(jnp.int32)
  out = expert_fn(recv[by_expert], group_sizes, gate, up, down)
  out = jnp.zeros_like(out).at[by_expert].set(out)
  y_sorted = back(out)  # [T_s * K, D], 0 where dropped
  y = jnp.zeros_like(y_sorted).at[order].set(y_sorted).reshape(num_tokens, k, -1)
  dropped = jnp.sum(~keep & valid[order // k]).astype(jnp.float32)
  y = jnp.einsum("tkd,tk->td", y, weights.astype(y.dtype))
  return y, jax.lax.psum(dropped, ep_specs.token_axes) if ep_specs.token_axes else dropped


def dispatch(
  x: jax.Array,
  weights: jax.Array,
  experts: jax.Array,
  valid: jax.Array,
  gate: jax.Array,
  up: jax.Array,
  down: jax.Array,
  *,
  expert_fn: Callable,
  mesh: Mesh,
  rules: Sequence,
  capacity_factor: float | None = None,
  ragged: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Expert-parallel routed experts -> (`y [T, D]`, dropped assignments, float32 scalar).

  Args:
    x: `[T, D]` tokens; weights: `[T, K]` gate values; experts: `[T, K]` int expert ids;
      valid: `[T]` bool (False = padding: computed, but never counted as dropped).
    gate, up, down: `[E, D, F]`, `[E, D, F]`, `[E, F, D]` expert weights, E divisible by
      expert parallelism (the size of the axis the rules shard 'experts' over).
    expert_fn: `(rows [N, D] sorted by local expert, group_sizes [E/EP], gate, up, down)
      -> [N, D]`, 0 for rows past the groups (`moe.grouped_swiglu`).
    mesh: the expert view of the dual mesh (`parallel.mesh.EXPERT_AXES`).
    rules: the layout's expert-view rules (`rules.expert`), giving every spec (`specs`).
    capacity_factor: per-peer buffer size (`buffer_capacity`); None = nothing drops.
    ragged: use `ragged_all_to_all` (default: unless the mesh's devices are CPUs).
  """
  sp = specs(mesh, rules)
  ep = 1 if sp.ep_axis is None else mesh.shape[sp.ep_axis]
  num_experts = gate.shape[0]
  if num_experts % ep:
    raise ValueError(
      f"n_routed_experts={num_experts} is not divisible by expert parallelism "
      f"{ep} (mesh axis {sp.ep_axis!r}); use an expert axis size dividing it"
    )
  if ragged is None:
    concrete = isinstance(mesh, Mesh)  # an AbstractMesh (memory plans) has no devices
    ragged = (mesh.devices.flat[0].platform if concrete else jax.default_backend()) != "cpu"
  ragged = ragged and sp.ep_axis is not None  # one expert shard: nothing to exchange
  shards = math.prod(mesh.shape[a] for a in sp.token_axes)
  num_tokens = x.shape[0]
  pad = -num_tokens % shards  # tokens are split evenly over the token axes
  if pad:
    x, weights, experts, valid = (
      jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)) for a in (x, weights, experts, valid)
    )
  cap = buffer_capacity(x.shape[0] // shards, experts.shape[1], num_experts, ep, capacity_factor)
  fn = jax.shard_map(
    functools.partial(_shard_moe, expert_fn=expert_fn, ep_specs=sp, ep=ep, cap=cap, ragged=ragged),
    mesh=mesh,
    in_specs=(sp.tokens,) + (sp.rows,) * 3 + (sp.gate_up,) * 2 + (sp.down,),
    out_specs=(sp.tokens, PartitionSpec()),
  )
  y, dropped = fn(x, weights, experts, valid, gate, up, down)
  return y[:num_tokens], dropped
