"""Logical axis names: the one table that drives sharding (both mesh views) and Muon.

Every parameter is created with a tuple of logical axis names (flax
`nn.with_logical_partitioning`; scanned stacks get a leading 'layers' axis). Mesh
rules in `composer_jax.parallel` map these names to mesh axes, and
`composer_jax.optim` derives from the same names which optimizer a parameter gets
and at what granularity Muon orthogonalizes it:

* BATCH axes index independent matrices: Muon runs Newton–Schulz separately on
  each slice (per layer, per expert, per head).
* MATRIX axes are the rows/columns of those matrices. A parameter goes to Muon iff
  it has exactly two MATRIX axes and no ADAM axis.
* ADAM axes mark parameters that always go to AdamW (embeddings, output head,
  router, norm scales, biases), whatever their rank.

| name          | role   | where                                               |
|---------------|--------|-----------------------------------------------------|
| layers        | batch  | leading axis of every scanned stack                 |
| experts       | batch  | routed-expert stacks                                |
| heads         | batch  | attention query/output heads                        |
| kv_heads      | batch  | GQA key/value heads                                 |
| embed         | matrix | model width D                                       |
| mlp           | matrix | dense / shared-expert SwiGLU hidden                 |
| expert_mlp    | matrix | routed-expert SwiGLU hidden                         |
| q_lora        | matrix | MLA query latent (q_lora_rank)                      |
| kv_lora       | matrix | MLA kv latent (+ decoupled rope key on kv_a)        |
| head_dim      | matrix | per-head feature dim (nope+rope for q, nope+v, v)   |
| vocab         | adam   | token embedding and output head                     |
| router        | adam   | router logits over experts                          |
| norm          | adam   | RMSNorm scales                                      |
"""

from typing import Any

BATCH_AXES = ("layers", "experts", "heads", "kv_heads")
MATRIX_AXES = ("embed", "mlp", "expert_mlp", "q_lora", "kv_lora", "head_dim")
ADAM_AXES = ("vocab", "router", "norm")
ALL_AXES = BATCH_AXES + MATRIX_AXES + ADAM_AXES


def check_names(names: tuple[str, ...], where: Any = "") -> None:
  """Raises if `names` uses a logical axis name that is not in the table."""
  unknown = [n for n in names if n not in ALL_AXES]
  if unknown:
    raise ValueError(f"Unknown logical axis name(s) {unknown} at {where}; valid: {ALL_AXES}")


def uses_muon(names: tuple[str, ...]) -> bool:
  """True iff a parameter with these logical axes is orthogonalized by Muon."""
  check_names(names)
  if any(n in ADAM_AXES for n in names):
    return False
  return sum(n in MATRIX_AXES for n in names) == 2


def muon_dims(names: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[int, int]]:
  """(batch axis indices, (reduction/in axis, output axis)) of a Muon parameter.

  Kernels are stored input-first (`y = x @ W`), so the first MATRIX axis is the
  reduction (fan-in) axis and the second the output (fan-out) axis — the
  convention of `optax.contrib.MuonDimensionNumbers(reduction_axis, output_axis)`.
  """
  if not uses_muon(names):
    raise ValueError(f"Parameter with logical axes {names} is not a Muon parameter")
  batch = tuple(i for i, n in enumerate(names) if n in BATCH_AXES)
  matrix = tuple(i for i, n in enumerate(names) if n in MATRIX_AXES)
  return batch, (matrix[0], matrix[1])
