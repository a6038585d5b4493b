"""Context parallelism: the sequence sharded over the dense view's `context` axis.

Load-balanced ("zig-zag") layout: the sequence is split into `2 * CP` equal chunks and
context rank `r` holds chunks `r` and `2 * CP - 1 - r`. Under a causal mask a query at
index `t` attends `t + 1` keys, so pairing an early chunk with its mirror late chunk gives
every rank the same work: `c^2 (2 CP - 1) + c (c + 1)` attended pairs for chunk length `c`
(plain contiguous sharding would give the last rank ~`2 CP - 1` times the first's).

The permutation is applied once to the batch, host-side (`zigzag` on tokens, targets,
segment ids, positions and loss mask in `train.placement.to_global`), so every per-token
layer (embedding, norms, MLPs, MoE, the token-summed loss) is unaffected, RoPE sees the
true positions (explicit inputs), and the model's hidden states come out in zig-zag order.
(Bounded-buffer MoE dispatch — `capacity`, or `expert_parallel` with `ep_capacity_factor` —
drops by row order, so which tokens it drops changes with the layout; dropless is exact.)
Only attention mixes tokens: its mask orders tokens by `zigzag_order` (the original index
of each row slot, `attention_mask(segment_ids, order)`), and `attention` runs it inside
`jax.shard_map`, where each rank all-gathers the per-token key/value inputs of the whole
sequence and attends its own queries to them (all-gather context parallelism with zig-zag
balancing, as in Llama 3, arXiv 2407.21783 §3.3.2). For MLA (arXiv 2405.04434 §2.1) that
input is the compressed latent `[c_kv | k_rope]` (`kv_lora_rank + qk_rope_head_dim` floats per
token, shared by all heads) and each rank expands K/V locally with `kv_b`: DeepSeek-V3
gathers 576 floats per token instead of the 40,960 of its K/V (`H (d_nope + d_rope + d_v)`),
71x less. GQA gathers `k | v` (`2 G d_head` per token).

Selected by the trainer's dual mesh (`context_mesh.current()`, context size > 1). Every
in/out spec of the `shard_map` comes from the layout's dense rules (`context_mesh.current_rules()`)
through `parallel.rules.logical_to_spec`, with the activation names `batch`, `seq`, `act_heads`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import PartitionSpec

from composer_jax.parallel import context_mesh
from composer_jax.parallel import rules as rules_lib
from composer_jax.parallel.mesh import DualMesh
from composer_jax.parallel.validation import check_context_split

Dims = Sequence[str | None]


def context_size(dual_mesh: DualMesh | None) -> int:
  """Context-parallel degree of `dual_mesh` (1 for None)."""
  return 1 if dual_mesh is None else dual_mesh.dense.shape["context"]


def zigzag_order(length: int, cp: int) -> np.ndarray:
  """`[length]` int: the original sequence index of each slot of the zig-zag layout.

  `x_zigzag = x[order]`; slots `[r L / CP, (r + 1) L / CP)` belong to context rank `r`
  and hold chunks `r` and `2 CP - 1 - r` of the `2 CP` chunks of `x`.

  Raises:
    ValueError: `length` is not divisible by `2 * cp`.
  """
  check_context_split(length, cp)
  chunks = np.arange(length).reshape(2 * cp, length // (2 * cp))
  ranks = np.arange(cp)
  return chunks[np.stack([ranks, 2 * cp - 1 - ranks], axis=1).reshape(-1)].reshape(-1)


def zigzag(x, cp: int, axis: int = -1):
  """Sequence order -> zig-zag order along `axis` (numpy or jax array)."""
  return x.take(zigzag_order(x.shape[axis], cp), axis=axis)


def unzigzag(x, cp: int, axis: int = -1):
  """Zig-zag order -> sequence order along `axis`; inverse of `zigzag`."""
  return x.take(np.argsort(zigzag_order(x.shape[axis], cp)), axis=axis)


def sequence_order(length: int) -> np.ndarray | None:
  """Original index of each row slot under the traced mesh (None: rows are in order)."""
  cp = context_size(context_mesh.current())
  return zigzag_order(length, cp) if cp > 1 else None


def enabled() -> bool:
  """True iff the model is being traced under a context-parallel dual mesh."""
  return context_size(context_mesh.current()) > 1


def _spec(dims: Dims) -> PartitionSpec:
  """Dense-view spec of logical `dims` under the traced layout's rules."""
  rules = context_mesh.current_rules()
  return rules_lib.logical_to_spec(
    dims, rules.dense, context_mesh.current().dense, where="context-parallel attention"
  )


def attention(
  attend: Callable,
  q: jax.Array,
  kv: jax.Array,
  mask: jax.Array,
  *,
  kv_dims: Dims,
  weights: Sequence[jax.Array] = (),
  weight_dims: Sequence[Dims] = (),
) -> jax.Array:
  """`attend(q, kv, mask, *weights)` with queries sharded over `context`, kv all-gathered.

  Runs in `jax.shard_map` over the dense view of `context_mesh.current()`, dims placed by
  the layout's rules (by default batch over `replica x fsdp`, sequence over `context`,
  heads over `tensor`). Each rank gathers `kv` along the sequence (one all-gather), so
  `attend` sees its own `L / CP` queries and all `L` keys, in zig-zag order.

  Args:
    attend: `(q [b, L/CP, h, dq], kv [b, L, ...], mask [b, 1, L/CP, L], *weights)
      -> [b, L/CP, h, dv]` on one shard.
    q: `[B, L, H, dq]` queries.
    kv: `[B, L, ...]` per-token key/value inputs (for MLA the latent, for GQA k|v).
    mask: `[B, 1, L, L]` bool, built with `attention_mask(segment_ids, zigzag order)`.
    kv_dims: logical activation name per dim of `kv`: 'batch', 'seq', 'act_heads' or None.
    weights: arrays `attend` needs whole on each shard (except a heads dim).
    weight_dims: dims of each weight, like `kv_dims` ('act_heads' for its heads dim).
  Returns:
    `[B, L, H, dv]`, sharded like `q`.
  Raises:
    ValueError: the rules do not shard 'seq' over exactly the `context` axis.
  """
  mesh = context_mesh.current().dense
  q_spec = _spec(("batch", "seq", "act_heads", None))
  if q_spec[1] != "context":  # the zig-zag order and the kv all-gather are over `context`
    raise ValueError(
      f"context-parallel attention needs the dense rule 'seq' -> 'context'; the "
      f"layout's rules shard the sequence over {q_spec[1]!r}"
    )

  def local(q, kv, mask, *weights):
    kv = jax.lax.all_gather(kv, "context", axis=1, tiled=True)
    return attend(q, kv, mask, *weights)

  in_specs = (
    q_spec,
    _spec(kv_dims),
    _spec(("batch", None, "seq", None)),
    *(_spec(d) for d in weight_dims),
  )
  return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=q_spec)(q, kv, mask, *weights)
