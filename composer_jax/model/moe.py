"""DeepSeekMoE layer (arXiv 2401.06066, 2412.19437 §2.1.2): shared + routed SwiGLU experts.

`y = shared(x) + sum_{e in TopK(x)} g_e(x) * expert_e(x)`. Routing in `router.py`;
three interchangeable dispatches of the routed experts (`cfg.moe_dispatch`):

* `dropless`: sort the T*K token-expert assignments by expert and run grouped matmuls
  (`jax.lax.ragged_dot`) with per-expert group sizes — no token is ever dropped.
* `capacity`: each expert processes at most `C = ceil(capacity_factor * T * K / E)`
  assignments (GShard, arXiv 2006.16668); priority is k-major (every token's first
  choice before any second choice), in token order; the rest are dropped and counted.
* `dense`: every expert on every token, weighted by the sparse gate — the reference.
* `expert_parallel`: the experts sharded over the `expert` mesh axis, tokens exchanged with
  all-to-all, each shard running `grouped_swiglu` on its experts
  (`composer_jax.parallel.expert_parallel`) on the mesh of `context_mesh.current()` (set by
  the trainer); `dropless` outside any mesh.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from composer_jax.model.config import ModelConfig
from composer_jax.model.layers import Linear, SwiGLU, param_init
from composer_jax.model.router import balance_loss, route, router_stats, update_router_bias
from composer_jax.parallel import context_mesh, expert_parallel

__all__ = ["MoE", "Experts", "update_router_bias"]


def _swiglu_experts(x, gate, up, down, matmul):
  """down(silu(x @ gate) * (x @ up)) with a per-expert `matmul(x, w)`."""
  return matmul(nn.silu(matmul(x, gate)) * matmul(x, up), down)


def grouped_swiglu(h, group_sizes, gate, up, down):
  """Experts on rows sorted by expert: `h [N, D]`, `group_sizes [E]` -> `[N, D]`.

  Rows `group_sizes[:e].sum() ..` up to `+ group_sizes[e]` go to expert `e`; rows past
  `group_sizes.sum()` (empty buffer slots) give 0.
  """
  matmul = lambda a, w: jax.lax.ragged_dot(a, w, group_sizes)
  return _swiglu_experts(h, gate, up, down, matmul)


def dropless(x, weights, experts, valid, gate, up, down):
  """Sorted grouped-matmul dispatch; `x [T, D]`, `weights`/`experts [T, K]` -> `[T, D]`, 0."""
  del valid  # Padding tokens are computed like any other (static shapes); never dropped.
  num_tokens, k = experts.shape
  flat = experts.reshape(-1)
  order = jnp.argsort(flat, stable=True)  # assignment ids sorted by expert
  group_sizes = jnp.bincount(flat, length=gate.shape[0]).astype(jnp.int32)
  y_sorted = grouped_swiglu(x[order // k], group_sizes, gate, up, down)  # [T*K, D]
  y = y_sorted[jnp.argsort(order)].reshape(num_tokens, k, -1)
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
  combine = jnp.sum(jax.nn.one_hot(experts, gate.shape[0], dtype=weights.dtype)
                    * weights[..., None], axis=1)  # [T, E]
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
        name, param_init(c.initializer_range, names), shape, c.param_dtype).astype(c.dtype)
    gate = mk("gate", (e, d, f), ("experts", "embed", "expert_mlp"))
    up = mk("up", (e, d, f), ("experts", "embed", "expert_mlp"))
    down = mk("down", (e, f, d), ("experts", "expert_mlp", "embed"))
    args = (x.astype(c.dtype), weights, experts, valid, gate, up, down)
    dual_mesh = context_mesh.current()
    if c.moe_dispatch == "expert_parallel" and dual_mesh is not None:
      return expert_parallel.dispatch(*args, expert_fn=grouped_swiglu, mesh=dual_mesh.expert,
                                      capacity_factor=c.ep_capacity_factor)
    if c.moe_dispatch in ("dropless", "expert_parallel"):  # no mesh: one device
      return dropless(*args)
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
    logits = Linear((d,), (e,), ("embed", "router"), init_std=c.initializer_range,
                    dtype="float32", param_dtype=c.param_dtype, name="router")(x)
    bias = self.variable("router", "bias", nn.with_logical_partitioning(
        lambda shape: jnp.zeros(shape, jnp.float32), ("router",)), (e,)).value
    weights, experts, scores = route(logits.reshape(b * length, e), bias, c)
    flat_valid = valid.reshape(-1)
    y, dropped = Experts(c, name="experts")(x.reshape(b * length, d), weights, experts, flat_valid)
    y = y.reshape(b, length, d)
    if c.n_shared_experts:
      y = y + SwiGLU(d, c.n_shared_experts * c.moe_intermediate_size, c.initializer_range,
                     c.dtype, c.param_dtype, name="shared")(x)
    stats = router_stats(experts, scores, flat_valid)
    stats["dropped_tokens"] = jax.lax.stop_gradient(dropped)
    if c.seq_aux_loss_coef > 0:
      stats["balance_loss"] = balance_loss(experts.reshape(b, length, -1),
                                           scores.reshape(b, length, e), valid,
                                           c.seq_aux_loss_coef)
    else:
      stats["balance_loss"] = jnp.zeros((), jnp.float32)
    return y.astype(c.dtype), stats
