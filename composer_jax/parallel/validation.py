"""Checks that a mesh layout fits a model and a sequence length, with one-line errors.

Per-parameter divisibility and missing rules are checked where shardings are
built (`composer_jax.parallel.rules.param_shardings(..., shapes=...)`); this module
checks the layout-level constraints that no single parameter shows. It takes the
few model sizes it needs as plain numbers (the trainer passes them from its
`ModelConfig`, `composer_jax.train.placement.build_mesh`), so `parallel` stays below
`model` in the layering.
"""

from __future__ import annotations

from composer_jax.parallel.mesh import DENSE_AXES, EXPERT_AXES, resolve_sizes


def validate_layout(
  mesh_cfg,
  num_devices: int,
  *,
  routed_experts: int = 0,
  heads: int = 1,
  kv_heads: int | None = None,
  seq_len: int | None = None,
) -> None:
  """Raises ValueError if the layout cannot run a model of these sizes on `num_devices`.

  Checks: each view's axis sizes multiply to `num_devices`; routed experts divide
  evenly over expert parallelism; attention heads over tensor parallelism; the
  sequence over 2 x context parallelism (load-balanced context parallelism
  splits the sequence into 2*CP chunks and gives rank r chunks r and 2*CP-1-r, so
  causal work is equal per rank).

  Args:
    mesh_cfg: the `mesh` config section (`composer_jax.parallel.mesh`).
    num_devices: devices the layout is laid over.
    routed_experts: routed experts per MoE layer (0: no MoE layer).
    heads: attention query heads.
    kv_heads: GQA key/value heads (None: no separate key/value heads, e.g. MLA).
    seq_len: tokens per row (None: not checked).
  """
  dense = dict(zip(DENSE_AXES, resolve_sizes(mesh_cfg, DENSE_AXES, num_devices)))
  expert = dict(zip(EXPERT_AXES, resolve_sizes(mesh_cfg, EXPERT_AXES, num_devices)))
  if routed_experts % expert["expert"]:
    raise ValueError(
      f"n_routed_experts={routed_experts} is not divisible by expert parallelism {expert['expert']}"
    )
  tp = dense["tensor"]
  if heads % tp:
    raise ValueError(f"num_heads={heads} is not divisible by tensor parallelism {tp}")
  if kv_heads is not None and kv_heads % tp:
    raise ValueError(f"num_kv_heads={kv_heads} is not divisible by tensor parallelism {tp}")
  if seq_len is not None:
    check_context_split(seq_len, dense["context"])


def check_context_split(seq_len: int, cp: int) -> None:
  """Raises ValueError unless `seq_len` splits into 2 * `cp` equal zig-zag chunks."""
  if seq_len % (2 * cp):
    raise ValueError(
      f"seq_len={seq_len} is not divisible by 2 * context parallelism = {2 * cp}; "
      f"use a sequence length that is a multiple of {2 * cp}"
    )
