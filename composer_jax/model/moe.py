"""DeepSeekMoE layer (arXiv 2401.06066, 2412.19437 §2.1.2): shared + routed SwiGLU experts.

`y = shared(x) + sum_{e in TopK(x)} g_e(x) * expert_e(x)`. Routing in `router.py`;
three interchangeable dispatches of the routed experts (`cfg.moe_dispatch`):

* `dropless`: sort the T*K token-expert assignments by expert and run grouped matmuls
  with per-expert group sizes — no token is ever dropped. The grouped matmul
  (`cfg.moe_grouped_matmul`, `GROUPED_MATMULS`) is `jax.lax.ragged_dot` on GPU/TPU (a
  grouped GEMM there) and `looped` (`expert_loop.py`) on CPU, where XLA lowers
  `ragged_dot` to a masked dense matmul over all E experts (E x the active FLOPs, forward
  and backward); `unrolled` for the CPU sampler's few rows per step.
* `capacity`: each expert processes at most `C = ceil(capacity_factor * T * K / E)`
  assignments (GShard, arXiv 2006.16668); priority is k-major (every token's first
  choice before any second choice), in token order; the rest are dropped and counted.
* `dense`: every expert on every token, weighted by the sparse gate — the reference.
* `expert_parallel`: the experts sharded over the `expert` mesh axis, tokens exchanged with
  all-to-all, each shard running `grouped_swiglu` on its experts
  (`composer_jax.parallel.expert_parallel`) on the expert view of `context_mesh.current()`
  with the expert rules of `context_mesh.current_rules()` (set by the trainer); `dropless`
  outside any mesh.
"""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from composer_jax.model import expert_loop
from composer_jax.model.config import ModelConfig
from composer_jax.model.layers import Linear, SwiGLU, param_init
from composer_jax.model.router import balance_loss, route, router_stats, update_router_bias
from composer_jax.parallel import context_mesh, expert_parallel

__all__ = ["MoE", "Experts", "update_router_bias"]


def _swiglu_experts(x, gate, up, down, matmul):
  """down(silu(x @ gate) * (x @ up)) with a per-expert `matmul(x, w)`."""
  return matmul(nn.silu(matmul(x, gate)) * matmul(x, up), down)


def tile_layout(group_sizes: jax.Array, num_rows: int, tile_rows: int):
  """Where sorted rows go when each expert's group is padded to whole tiles of `tile_rows`.

  `group_sizes [E]` of `num_rows` sorted rows (rows past the sum belong to no group).
  Each group takes `ceil(g_e / tile)` tiles, so at most `ceil(N / tile) + E` tiles in all
  (static). Returns (`src [n_tiles * tile]`: the row each tile slot reads, `N` = none;
  `dest [N]`: the slot each row is written to, `n_tiles * tile` = none; `tile_expert
  [n_tiles]`: the expert of each tile, clipped to E - 1 for unused tiles, whose rows are 0).
  """
  num_experts = group_sizes.shape[0]
  n_tiles = -(-num_rows // tile_rows) + num_experts
  padded = (group_sizes + tile_rows - 1) // tile_rows * tile_rows
  pad_end, end = jnp.cumsum(padded), jnp.cumsum(group_sizes)
  pad_start, start = pad_end - padded, end - group_sizes
  row = jnp.arange(num_rows)
  row_expert = jnp.minimum(jnp.searchsorted(end, row, side="right"), num_experts - 1)
  in_group = row < end[-1]
  dest = jnp.where(in_group, pad_start[row_expert] + row - start[row_expert], n_tiles * tile_rows)
  slot = jnp.arange(n_tiles * tile_rows)
  slot_expert = jnp.minimum(jnp.searchsorted(pad_end, slot, side="right"), num_experts - 1)
  offset = slot - pad_start[slot_expert]
  src = jnp.where(offset < group_sizes[slot_expert], start[slot_expert] + offset, num_rows)
  return src, dest, slot_expert[::tile_rows]


@jax.custom_vjp
def _move_rows(x, idx, inverse):
  """`x[idx]` (0 where `idx` is out of range) for a one-to-one row map with `inverse`.

  Each row of `x` lands in at most one output row, so the gradient is the gather
  `g[inverse]` (0 out of range): no scatter-add, which is slow on XLA:CPU.
  """
  return jnp.take(x, idx, axis=0, mode="fill", fill_value=0)


def _move_rows_fwd(x, idx, inverse):
  return _move_rows(x, idx, inverse), (idx, inverse)


def _move_rows_bwd(res, g):
  idx, inverse = res
  zero_int = lambda a: np.zeros(a.shape, jax.dtypes.float0)
  return _move_rows(g, inverse, idx), zero_int(idx), zero_int(inverse)


_move_rows.defvjp(_move_rows_fwd, _move_rows_bwd)


def _tiled(h, group_sizes, gate, up, down, tile_rows):
  """SwiGLU experts as one batched matmul over expert-pure tiles of rows.

  Rows are copied into `[n_tiles, tile, D]` (each expert's group padded to whole tiles,
  `tile_layout`), each tile multiplies its expert's weights (gathered per tile), and the
  rows are copied back: `(N + E * tile) * D * F` multiply-adds per matmul instead of
  `ragged_dot`'s `N * E * D * F` on XLA:CPU.
  """
  num_rows, d = h.shape
  # Shrink tiles when groups are small (few rows per expert): padding costs E * tile rows.
  tile = max(8, min(tile_rows, 1 << max(0, (num_rows // gate.shape[0]).bit_length() - 1)))
  src, dest, tile_expert = tile_layout(group_sizes, num_rows, tile)
  tiles = _move_rows(h, src, dest).reshape(-1, tile, d)
  matmul = lambda a, w: jnp.einsum("ntd,ndf->ntf", a, w[tile_expert])
  out = _swiglu_experts(tiles, gate, up, down, matmul).reshape(-1, d)
  return _move_rows(out, dest, src)


def _ragged_swiglu(h, group_sizes, gate, up, down, tile_rows):
  """SwiGLU experts with `jax.lax.ragged_dot` (a grouped GEMM on GPU/TPU)."""
  del tile_rows
  return _swiglu_experts(h, gate, up, down, lambda a, w: jax.lax.ragged_dot(a, w, group_sizes))


def _looped(h, group_sizes, gate, up, down, tile_rows):
  """SwiGLU experts in a loop over experts and chunks of their rows (`expert_loop.py`)."""
  chunk = expert_loop.chunk_rows(h.shape[0], gate.shape[0], tile_rows)
  return expert_loop.looped_swiglu(h, group_sizes, gate, up, down, chunk)


def _unrolled(h, group_sizes, gate, up, down, tile_rows):
  """`_looped` with the experts unrolled and chunks down to one row: for few rows a call.

  Made for the CPU sampler's token loop (`rl/decode.py`), ~1 row per expert: there each
  expert's weights are a buffer of their own, sliced once per call, so `gate[e]` at a
  static `e` reads them in place (a traced `e` copies the expert out of `[E, D, F]`), and a
  one-row chunk is a matrix-vector product, which XLA:CPU runs at about twice the speed of
  an 8-row matmul (RESULTS.md, 2026-12-06). Compile time grows with E.
  """
  chunk = expert_loop.chunk_rows(h.shape[0], gate.shape[0], tile_rows, min_rows=1)
  return expert_loop.looped_swiglu(h, group_sizes, gate, up, down, chunk, unroll=True)


# Grouped SwiGLU implementations by name (`ModelConfig.moe_grouped_matmul`).
GROUPED_MATMULS = {
  "looped": _looped,
  "ragged_dot": _ragged_swiglu,
  "tiled": _tiled,
  "unrolled": _unrolled,
}


def resolve_grouped_matmul(name: str) -> str:
  """'auto' -> 'looped' on CPU, 'ragged_dot' on GPU/TPU; other names as given."""
  if name == "auto":
    return "looped" if jax.default_backend() == "cpu" else "ragged_dot"
  return name


def grouped_swiglu(
  h, group_sizes, gate, up, down, impl="auto", tile_rows=ModelConfig.moe_tile_rows
):
  """Experts on rows sorted by expert: `h [N, D]`, `group_sizes [E]` -> `[N, D]`.

  Rows `group_sizes[:e].sum() ..` up to `+ group_sizes[e]` go to expert `e`; rows past
  `group_sizes.sum()` (empty buffer slots) give 0. `impl`: a `GROUPED_MATMULS` name or
  'auto'; `tile_rows`: the largest row tile of `tiled` / chunk of `looped` (default: the
  config's).
  """
  return GROUPED_MATMULS[resolve_grouped_matmul(impl)](h, group_sizes, gate, up, down, tile_rows)


def dropless(x, weights, experts, valid, gate, up, down, expert_fn=grouped_swiglu):
  """Sorted grouped-matmul dispatch; `x [T, D]`, `weights`/`experts [T, K]` -> `[T, D]`, 0.

  `expert_fn`: a `grouped_swiglu` (its implementation bound by the caller).
  """
  del valid  # Padding tokens are computed like any other (static shapes); never dropped.
  num_tokens, k = experts.shape
  flat = experts.reshape(-1)
  order = jnp.argsort(flat, stable=True)  # assignment ids sorted by expert
  group_sizes = jnp.bincount(flat, length=gate.shape[0]).astype(jnp.int32)
  y_sorted = expert_fn(x[order // k], group_sizes, gate, up, down)  # [T*K, D]
  y = _move_rows(y_sorted, jnp.argsort(order), order).reshape(num_tokens, k, -1)
  return jnp.einsum("tkd,tk->td", y, weights.astype(y.dtype)), jnp.zeros((), jnp.float32)


def capacity(x, weights, experts, valid, gate, up, down, capacity_factor):
  """Capacity-limited dispatch into `[E, C, D]` buffers -> (`[T, D]`, dropped assignments)."""
  num_tokens, k = experts.shape
  num_experts = gate.shape[0]
  cap = max(1, math.ceil(capacity_factor * num_tokens * k / num_experts))
  flat = experts.T.reshape(-1)  # k-major: [K * T]
  flat_valid = jnp.tile(valid, k)
  onehot = jax.nn.one_hot(flat, num_experts, dtype=jnp.int32) * flat_valid[:, None]
  position = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1)  # rank in its expert
  keep = flat_valid & (position < cap)
  slot = jnp.where(keep, flat * cap + position, num_experts * cap)  # overflow -> dummy slot
  token = jnp.tile(jnp.arange(num_tokens), k)
  buf = jnp.zeros((num_experts * cap + 1, x.shape[-1]), x.dtype).at[slot].add(x[token])
  buf = buf[:-1].reshape(num_experts, cap, -1)
  out = _swiglu_experts(buf, gate, up, down, lambda h, w: jnp.einsum("ecd,edf->ecf", h, w))
  out = jnp.concatenate([out.reshape(num_experts * cap, -1), jnp.zeros_like(out[0, :1])])
  y = out[slot].reshape(k, num_tokens, -1)
  combine = (weights.T * keep.reshape(k, num_tokens)).astype(y.dtype)
  dropped = jnp.sum(flat_valid & ~keep).astype(jnp.float32)
  return jnp.einsum("ktd,kt->td", y, combine), dropped


def dense(x, weights, experts, valid, gate, up, down):
  """One-hot reference: every expert on every token -> (`[T, D]`, 0)."""
  del valid
  combine = jnp.sum(
    jax.nn.one_hot(experts, gate.shape[0], dtype=weights.dtype) * weights[..., None], axis=1
  )  # [T, E]
  hidden = nn.silu(jnp.einsum("td,edf->tef", x, gate)) * jnp.einsum("td,edf->tef", x, up)
  y = jnp.einsum("tef,efd->ted", hidden, down)
  return jnp.einsum("ted,te->td", y, combine.astype(y.dtype)), jnp.zeros((), jnp.float32)


class Experts(nn.Module):
  """E routed SwiGLU experts: `gate`/`up [E, D, Fe]`, `down [E, Fe, D]`.

  `x [T, D]`, `weights [T, K]`, `experts [T, K]`, `valid [T]` -> (`[T, D]`, dropped).
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, weights, experts, valid):
    c = self.cfg
    e, d, f = c.n_routed_experts, c.hidden_size, c.moe_intermediate_size
    mk = lambda name, shape, names: self.param(
      name, param_init(c.initializer_range, names), shape, c.param_dtype
    ).astype(c.dtype)
    gate = mk("gate", (e, d, f), ("experts", "embed", "expert_mlp"))
    up = mk("up", (e, d, f), ("experts", "embed", "expert_mlp"))
    down = mk("down", (e, f, d), ("experts", "expert_mlp", "embed"))
    args = (x.astype(c.dtype), weights, experts, valid, gate, up, down)
    expert_fn = functools.partial(
      grouped_swiglu, impl=c.moe_grouped_matmul, tile_rows=c.moe_tile_rows
    )
    dual_mesh = context_mesh.current()
    if c.moe_dispatch == "expert_parallel" and dual_mesh is not None:
      return expert_parallel.dispatch(
        *args,
        expert_fn=expert_fn,
        mesh=dual_mesh.expert,
        rules=context_mesh.current_rules().expert,
        capacity_factor=c.ep_capacity_factor,
      )
    if c.moe_dispatch in ("dropless", "expert_parallel"):  # no mesh: one device
      return dropless(*args, expert_fn=expert_fn)
    if c.moe_dispatch == "capacity":
      return capacity(*args, capacity_factor=c.capacity_factor)
    return dense(*args)


class MoE(nn.Module):
  """Router + routed experts + shared experts.

  `x [B, L, D]`, `valid [B, L]` bool (False = padding) -> (`[B, L, D]`, stats) with
  stats = router_stats(...) plus 'balance_loss' and 'dropped_tokens' scalars.
  The selection bias lives in the non-trainable 'router' collection.
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, valid: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    c = self.cfg
    b, length, d = x.shape
    e = c.n_routed_experts
    logits = Linear(
      (d,),
      (e,),
      ("embed", "router"),
      init_std=c.initializer_range,
      dtype="float32",
      param_dtype=c.param_dtype,
      name="router",
    )(x)
    bias = self.variable(
      "router",
      "bias",
      nn.with_logical_partitioning(lambda shape: jnp.zeros(shape, jnp.float32), ("router",)),
      (e,),
    ).value
    weights, experts, scores = route(logits.reshape(b * length, e), bias, c)
    flat_valid = valid.reshape(-1)
    y, dropped = Experts(c, name="experts")(x.reshape(b * length, d), weights, experts, flat_valid)
    y = y.reshape(b, length, d)
    if c.n_shared_experts:
      y = y + SwiGLU(
        d,
        c.n_shared_experts * c.moe_intermediate_size,
        c.initializer_range,
        c.dtype,
        c.param_dtype,
        name="shared",
      )(x)
    stats = router_stats(experts, scores, flat_valid)
    stats["dropped_tokens"] = jax.lax.stop_gradient(dropped)
    if c.seq_aux_loss_coef > 0:
      stats["balance_loss"] = balance_loss(
        experts.reshape(b, length, -1), scores.reshape(b, length, e), valid, c.seq_aux_loss_coef
      )
    else:
      stats["balance_loss"] = jnp.zeros((), jnp.float32)
    return y.astype(c.dtype), stats
