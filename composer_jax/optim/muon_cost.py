"""Analytic cost of one sharded-Muon optimizer step: Newton–Schulz FLOPs, all-to-all bytes.

Newton–Schulz on one matrix [m, n] with m <= n (a tall one is iterated as its transpose,
so the Gram matrix is always the small side) costs per iteration (`newton_schulz_iterate`)

    A = X X^T          2 m^2 n
    A^2 = A A          2 m^3
    (bA + cA^2) X      2 m^2 n
    -------------------------------
    4 m^2 n + 2 m^3    FLOPs  (+ O(mn) elementwise, ignored)

so `steps * (4 m^2 n + 2 m^3)` per matrix (5 steps: 20 m^2 n + 10 m^3). This is the
algorithm's count, the yardstick for any implementation (MFU): ours multiplies fewer,
since the two symmetric products skip their blocks below the diagonal on large matrices
(`newton_schulz.symmetric_product`; at m = 512, n = 1024 it multiplies 9/16 of X X^T's
FLOPs and 5/8 of A^2's, so 3/4 of the count above).

The sharded optimizer (`composer_jax.optim.sharded_muon`) moves a matrix
sharded k ways with one all-to-all to one device and back with another: each
of the k holders sends (k-1)/k of its block, so 2 (k-1)/k * bytes(matrix) cross
the network per matrix and step; matrices already whole (expert parallel) move
nothing.
"""

from __future__ import annotations

import collections
import math
from typing import Any, NamedTuple

import jax

from composer_jax.model import axes as axes_lib
from composer_jax.optim import muon
from composer_jax.parallel.rules import view_of


class MatrixSet(NamedTuple):
  """`count` independent Muon matrices [fan_in, fan_out] of one parameter."""

  path: str
  view: str  # 'dense' or 'expert'
  count: int
  fan_in: int
  fan_out: int


def ns_flops(m: int, n: int, steps: int = 5) -> int:
  """FLOPs of `steps` Newton–Schulz iterations on one [m, n] matrix (module doc)."""
  m, n = min(m, n), max(m, n)
  return steps * (4 * m * m * n + 2 * m**3)


def all_to_all_bytes(m: int, n: int, k: int, bytes_per_elem: int = 4) -> float:
  """Bytes one [m, n] matrix sharded k ways sends per step (gather + scatter back)."""
  return 2 * (k - 1) / k * m * n * bytes_per_elem


def muon_matrices(logical_axes: Any, shapes: Any) -> list[MatrixSet]:
  """Every Muon parameter as a MatrixSet (from logical names and shapes trees)."""
  out = []
  flat = jax.tree_util.tree_leaves_with_path(logical_axes, is_leaf=muon.is_axes_leaf)
  for (path, names), x in zip(flat, jax.tree.leaves(shapes)):
    if not axes_lib.uses_muon(names):
      continue
    batch, _ = axes_lib.muon_dims(names)
    fan_in, fan_out = muon.fan_in_out(x.shape, names)
    out.append(
      MatrixSet(
        jax.tree_util.keystr(path),
        view_of(names),
        math.prod(x.shape[i] for i in batch),
        fan_in,
        fan_out,
      )
    )
  return out


class StepCost(NamedTuple):
  """Per-device cost of one optimizer step on `devices` GPUs (seconds, FLOPs, bytes)."""

  devices: int
  dense_flops: float  # NS FLOPs per device, dense view
  expert_flops: float  # NS FLOPs per device, expert view
  dense_bytes: float  # all-to-all bytes sent per device (intra-node)
  expert_bytes: float  # all-to-all bytes sent per device (inter-node)
  compute_s: float
  comm_s: float

  @property
  def overlapped_s(self) -> float:
    return max(self.compute_s, self.comm_s)

  @property
  def serial_s(self) -> float:
    return self.compute_s + self.comm_s


def step_cost(
  matrices: list[MatrixSet],
  devices: int,
  *,
  node: int,
  n_experts: int,
  peak_flops: float,
  efficiency: float,
  intra_bw: float,
  inter_bw: float,
  steps: int = 5,
  bytes_per_elem: int = 4,
) -> StepCost:
  """Cost of one step under the dual-mesh layout of the Composer report.

  Dense view: HSDP, FSDP over the `node` GPUs of a node (replicas compute the
  same NS): the node's NS work is split evenly over its GPUs at whole-matrix
  granularity, and matrices travel over the intra-node link (`intra_bw`
  bytes/s per GPU, one direction). Expert view: all `devices` GPUs; experts are
  expert-parallel over EP = min(devices, n_experts) and each expert's matrices
  FSDP-sharded k = devices / EP ways, so every GPU orthogonalizes an equal share
  of whole expert matrices, moved over `inter_bw`.
  """
  if (
    devices % node
    or (devices > n_experts and devices % n_experts)
    or (devices < n_experts and n_experts % devices)
  ):
    raise ValueError(
      f"devices={devices} must be a multiple of node={node} and divide or be a "
      f"multiple of n_experts={n_experts}"
    )
  k_expert = max(1, devices // n_experts)
  # Like the optimizer, batch same-shape matrices of a view into one group; a
  # group's matrices are split evenly (whole matrices, padded), so the busiest
  # device holds ceil(count / group) of them.
  groups = collections.Counter()
  for s in matrices:
    groups[(s.view, s.fan_in, s.fan_out)] += s.count
  dense_flops = expert_flops = dense_bytes = expert_bytes = 0.0
  for (view, m, n), count in groups.items():
    width, k = (node, node) if view == "dense" else (devices, k_expert)
    flops = math.ceil(count / width) * ns_flops(m, n, steps)
    sent = count / width * all_to_all_bytes(m, n, k, bytes_per_elem)
    if view == "dense":
      dense_flops, dense_bytes = dense_flops + flops, dense_bytes + sent
    else:
      expert_flops, expert_bytes = expert_flops + flops, expert_bytes + sent
  compute = (dense_flops + expert_flops) / (peak_flops * efficiency)
  comm = dense_bytes / intra_bw + expert_bytes / inter_bw
  return StepCost(devices, dense_flops, expert_flops, dense_bytes, expert_bytes, compute, comm)


def shared_mesh_devices(dense: dict, expert: dict) -> int:
  """Devices one shared mesh needs for a dual-view layout.

  In one mesh every axis multiplies; expert parallelism can reuse only the
  data-parallel axes (replica x fsdp), as in Megatron-LM before MoE parallel
  folding, so those must be a multiple of EP: tensor * context * lcm(dp, EP).
  The dual view needs only max(prod(dense), prod(expert)).
  """
  dp = dense["replica"] * dense["fsdp"]
  return dense["tensor"] * dense["context"] * math.lcm(dp, expert["expert"])
